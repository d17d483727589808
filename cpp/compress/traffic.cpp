// What the exchange sends, from shapes and levels alone (traffic.h).
#include "compress/traffic.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace accordion {

int64_t powerSgdRank(int64_t rows, int64_t cols, double level) {
  return std::min<int64_t>({rows, cols, static_cast<int64_t>(level)});
}

bool powerSgdCompresses(int64_t rows, int64_t cols, double level, double minCompressionRate) {
  const double r = static_cast<double>(powerSgdRank(rows, cols, level));
  return minCompressionRate <= 0 || static_cast<double>(rows + cols) * r * minCompressionRate < static_cast<double>(rows * cols);
}

int64_t topkCount(double ratio, int64_t numel) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(ratio * static_cast<double>(numel))));
}

Route routeOf(Compressor compressor, const Shape& shape, double level, double minCompressionRate) {
  if (shape.size() < 2 || compressor == Compressor::None) return Route::Dense;
  if (level == kDenseBf16) return Route::DenseBf16;
  if (level <= 0) return Route::Dense;
  const int64_t rows = shape[0], cols = numelOf(shape) / rows;
  if (compressor == Compressor::PowerSgd && !powerSgdCompresses(rows, cols, level, minCompressionRate)) return Route::Dense;
  return Route::Compressed;
}

std::vector<std::vector<size_t>> gradientBuckets(const std::vector<int64_t>& gradientBytes, int64_t bucketBytes) {
  std::vector<std::vector<size_t>> buckets;
  int64_t filled = 0;
  for (size_t k = gradientBytes.size(); k-- > 0;) {
    if (buckets.empty() ||
        (bucketBytes > 0 && filled >= (buckets.size() == 1 ? std::min(bucketBytes, kFirstBucketBytes) : bucketBytes))) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(k);
    filled += gradientBytes[k];
  }
  return buckets;
}

std::vector<BucketTraffic> exchangeTraffic(const TrafficQuery& q) {
  if (q.levels.size() != q.shapes.size())
    throw std::invalid_argument("exchangeTraffic: " + std::to_string(q.levels.size()) + " levels for " + std::to_string(q.shapes.size()) + " parameters");
  std::vector<int64_t> gradientBytes;
  for (const Shape& s : q.shapes) gradientBytes.push_back(numelOf(s) * static_cast<int64_t>(sizeof(float)));
  const int64_t value = bytesPerValue(q.sent);
  std::vector<BucketTraffic> traffic;
  for (const auto& bucket : gradientBuckets(gradientBytes, q.bucketBytes)) {
    BucketTraffic t;
    for (size_t k : bucket) {
      const Shape& shape = q.shapes[k];
      const int64_t numel = numelOf(shape), rows = shape.empty() ? 1 : shape[0], cols = rows ? numel / rows : 0;
      const double level = q.levels[k];
      switch (routeOf(q.compressor, shape, level, q.minCompressionRate)) {
        case Route::Dense: t.dense += numel * value; break;
        case Route::DenseBf16: t.denseBf16 += numel * bytesPerValue(Precision::Bf16); break;
        case Route::Compressed:
          if (q.compressor == Compressor::TopK) {
            t.topkPairs += topkCount(level, numel) * (4 + value);
          } else {
            t.powerSgdP += rows * powerSgdRank(rows, cols, level) * value;
            t.powerSgdQ += cols * powerSgdRank(rows, cols, level) * value;
          }
          break;
      }
    }
    traffic.push_back(t);
  }
  return traffic;
}

}  // namespace accordion
