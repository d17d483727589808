// What the exchange sends, from shapes and levels alone: the rules the compressors and the reducer
// send by (PowerSGD's rank and rate test, TopK's count, the buckets), answerable before any model
// exists. `accordion plan` and the wire check ask them through the binding, so that a change here
// reaches the predictions and the exchange at once.
#pragma once
#include <cstdint>
#include <vector>

#include "compress/compressor.h"

namespace accordion {

// PowerSGD's rank for a (rows, cols) matrix at `level`, clipped to min(rows, cols).
int64_t powerSgdRank(int64_t rows, int64_t cols, double level);
// Whether PowerSGD compresses the matrix at all: (rows + cols)·r·rate < rows·cols (PyTorch's
// min_compression_rate); rate 0 compresses every matrix.
bool powerSgdCompresses(int64_t rows, int64_t cols, double level, double minCompressionRate);
// TopK's pair count s = max(1, ⌊ratio·numel⌋).
int64_t topkCount(double ratio, int64_t numel);

// How a parameter travels at `level`: compressed (a matrix at a level > 0 that its compressor
// compresses), dense in bf16 through its error memory (a matrix at kDenseBf16), or dense (a 1-D
// tensor, level 0, no compressor, or a matrix PowerSGD's rate test leaves dense).
enum class Route { Dense, DenseBf16, Compressed };
Route routeOf(Compressor compressor, const Shape& shape, double level, double minCompressionRate);

// A step's exchange in buckets (compress/bucket_exchange.h): the parameters in reverse order, each
// bucket closed once it holds at least `bucketBytes` of gradients (so it overshoots by at most its
// last parameter), the first at kFirstBucketBytes when `bucketBytes` is larger: PyTorch DDP's rule,
// so that the exchange starts as soon as backward has begun; 0: one bucket. Indices into
// `gradientBytes`, in the order the buckets travel.
constexpr int64_t kFirstBucketBytes = int64_t{1} << 20;
std::vector<std::vector<size_t>> gradientBuckets(const std::vector<int64_t>& gradientBytes, int64_t bucketBytes);

// The bytes one worker hands to each collective of a bucket: the all-reduce of the dense tensors
// (in the exchange's precision), the all-reduce of matrices sent dense in bf16 (kDenseBf16), PowerSGD's
// all-reduces of P and of Q, TopK's all-gather of (index, value) pairs (this worker's share).
struct BucketTraffic {
  int64_t dense = 0, denseBf16 = 0, powerSgdP = 0, powerSgdQ = 0, topkPairs = 0;
};

struct TrafficQuery {
  Compressor compressor = Compressor::None;
  std::vector<Shape> shapes;   // the parameters, state_dict order
  std::vector<double> levels;  // each parameter's level (read for matrices only; 0: dense)
  int64_t bucketBytes = 0;
  Precision sent = Precision::Fp32;
  double minCompressionRate = 1.0;
};

std::vector<BucketTraffic> exchangeTraffic(const TrafficQuery& query);

}  // namespace accordion
