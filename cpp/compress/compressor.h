// A compressor with error feedback, as one strategy of the gradient exchange (reducer.h): it owns
// its state per weight matrix (the error memory; PowerSGD's Q), judges and prices its levels, and
// compresses and exchanges a set of matrices. The reducer keeps the buckets, the finite agreement,
// the dense tensors, the gradient sums and the accounting, and never asks which compressor it holds.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/process_group.h"
#include "core/tensor.h"
#include "ops/backend.h"

namespace accordion {

enum class Compressor { None, PowerSgd, TopK };

Compressor parseCompressor(const std::string& name);
const char* compressorName(Compressor c);

// One collective of an exchange as the link saw it: the bytes this rank sent (allReduceSentBytes,
// allGatherSentBytes) and the seconds it took, waiting for a late peer included.
struct CollectiveTime {
  double bytes = 0, seconds = 0;
};

// The group a step's collectives run on, timing them: `seconds` grows by each collective's duration
// (on a GPU group after the device has finished the buffer, so that only the collective is timed),
// and `times` keeps each one's (with two or more ranks).
class TimedGroup {
 public:
  TimedGroup(ProcessGroup& group, Backend& backend) : group_(group), backend_(backend) {}
  int size() const { return group_.size(); }
  // ProcessGroup::allReduceSumAs and allGatherAs (fp32: allReduceSum and allGather).
  void allReduceSum(float* data, int64_t count, Precision sent = Precision::Fp32) {
    timed(allReduceSentBytes(static_cast<double>(count * bytesPerValue(sent)), size()),
          [&] { group_.allReduceSumAs(data, count, sent); });
  }
  void allGather(const float* input, int64_t count, float* output, Precision sent = Precision::Fp32) {
    timed(allGatherSentBytes(static_cast<double>(count * bytesPerValue(sent)), size()),
          [&] { group_.allGatherAs(input, count, output, sent); });
  }
  double seconds = 0;
  std::vector<CollectiveTime> times;

 private:
  void timed(double sentBytes, const std::function<void()>& collective);
  ProcessGroup& group_;
  Backend& backend_;
};

// A buffer of at least `n` floats on the backend's device, reused between steps.
float* scratch(Tensor& buffer, int64_t n, Backend& backend);

// A matrix's level that sends it dense with its values in bf16 (summed in fp32, as
// ProcessGroup::allReduceSumAs), what the rounding loses kept in its error memory. Beside the
// compressor's own levels (> 0) and dense in the exchange's precision (0), it is a candidate of
// automatic levels where the exchange otherwise sends fp32.
constexpr double kDenseBf16 = -1;

// One weight matrix in an exchange: its gradient viewed as (rows, cols) = (shape[0], numel / shape[0]).
struct MatrixView {
  size_t index;  // the parameter's index in the reducer
  Parameter* parameter;
  int64_t rows, cols;
  double level;  // PowerSGD rank or TopK ratio (> 0: compressed), or kDenseBf16
};

// What compressing one weight matrix's gradient at one level costs (GradientReducer::levelCosts).
struct LevelCost {
  double level = 0;     // the candidate: a PowerSGD rank or TopK ratio, 0 = dense
  double error = 0;     // ‖G − C(G)‖ / ‖G‖ for the parameter's epoch sum G (0 when G = 0 or dense)
  int64_t floats = 0;   // floats this worker sends per step at this level
  int64_t bytes = 0;    // what they take on the wire, in the exchange's precision
  double seconds = 0;   // the compression kernels' time on G
};

class ErrorFeedbackCompressor {
 public:
  // `parameters`: every parameter of the reducer; the matrices among them (more than one dimension)
  // get a zero error memory. `sent`: the precision the compressed values travel in; what rounding
  // them loses joins the error memory.
  ErrorFeedbackCompressor(const std::vector<Parameter*>& parameters, Precision sent, Backend& backend);
  virtual ~ErrorFeedbackCompressor() = default;

  virtual Compressor kind() const = 0;
  // Throws, naming `where`, unless `level` is a level of this compressor.
  virtual void checkLevel(double level, const std::string& where) const = 0;
  // Floats this worker sends per step for such a matrix at `level`, among `world` workers.
  virtual int64_t floats(int64_t rows, int64_t cols, double level, int world) const = 0;
  // What those floats take on the wire in the exchange's precision (indices stay 4 bytes).
  virtual int64_t bytes(int64_t rows, int64_t cols, double level, int world) const = 0;
  // Matrix `view.index` goes to `view.level` (a change of level, or a fresh state; 0: sent dense).
  virtual void levelChanged(const MatrixView& view) {}
  // Replaces each matrix's gradient by the average over the workers of its decompressed compression,
  // with error feedback.
  virtual void exchange(const std::vector<MatrixView>& matrices, TimedGroup& group) = 0;
  // The same for matrices sent dense with their values rounded to `sent` (level kDenseBf16):
  // M = g + e is all-reduced in `sent`, summed in fp32; the average `out` becomes the gradient and
  // e = M − out keeps what the rounding lost. Host memory only, as every 16-bit exchange.
  void exchangeRounded(const std::vector<MatrixView>& matrices, Precision sent, TimedGroup& group);
  // What compressing `sum` (matrix `view.index`'s epoch sum) at `view.level` costs, from fresh state
  // (zero memory, a fresh Q), leaving the compressor's state as it was: the relative error of what
  // error feedback would keep, the floats, and the kernels' seconds.
  LevelCost price(const MatrixView& view, const Tensor& sum, int world);

  // The state of matrix `index` that a checkpoint keeps and a failed bucketed step puts back, by
  // key ("memory"; PowerSGD's "q"); empty for a 1-D parameter.
  virtual std::vector<std::pair<std::string, Tensor*>> state(size_t index);
  // Restarts error feedback as at construction (zero memories; PowerSGD draws its Q again).
  virtual void reset(const std::vector<MatrixView>& matrices);
  // Whether a matrix's memory is owed to its next dense gradient: set when it is set to dense (error
  // feedback owes it), paid (then zero) by payOwed.
  bool owes(size_t index) const { return owed_.at(index); }
  void setOwes(size_t index, bool owes) { owed_.at(index) = owes; }
  // Adds the owed memories of these dense parameters to their gradients, and zeroes them.
  void payOwed(const std::vector<size_t>& indices, const std::vector<Parameter*>& parameters);

 protected:
  // The kernels that compress `g` once at `view.level` from fresh state, leaving in `residual` (zero
  // before) what error feedback would keep. What they need is made before the returned function,
  // which alone is timed.
  virtual std::function<void()> compressOnce(const MatrixView& view, Tensor& g, Tensor& residual) = 0;

  Precision sent_;
  Backend& backend_;
  CompressionKernels& kernels_;
  std::vector<Tensor> memory_;  // per parameter: the error memory (PyTorch layout); undefined for 1-D
  std::vector<char> owed_;
  Tensor roundedBuffer_;  // exchangeRounded's values in flight
};

}  // namespace accordion
