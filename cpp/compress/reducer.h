// The exchange of gradients between workers, with compression and error feedback.
//
// After backward, GradientReducer::reduce() turns each parameter's local gradient into the
// gradient averaged over the workers. A weight matrix goes through the compressor's strategy at its
// current level (compress/powersgd.h, compress/topk.h); a 1-D tensor, a matrix at level 0 and every
// tensor without a compressor go dense: all-reduce, divide by W (floats sent: numel), all of them in
// one all-reduce.
//
// What is sent travels in ReducerOptions::sent precision (fp32, bf16, fp16), summed in fp32
// (ProcessGroup::allReduceSumAs). The compressors' error memories absorb what rounding loses; a
// dense gradient has no memory, so its rounding is lost. A matrix at level kDenseBf16 is the
// exception: sent dense in bf16 whatever the exchange's precision, in its own all-reduce, through
// its error memory (ErrorFeedbackCompressor::exchangeRounded). With one worker nothing travels and
// nothing is rounded. "Bytes sent" is the floats sent at their size on the wire (indices: 4 bytes).
//
// "Floats sent" is the paper's figure (docs/accounting.md §1) and only that. Before them, the workers
// agree on whether every gradient is finite: an all-reduce of W floats per step, the step's
// overhead. With W ≥ 2, floats sent + overhead is exactly what the group's collectives carry during
// reduce() by the group's counting convention (comm/process_group.h: an all-gather counts its
// gathered result, so TopK's all-gather of 2·s floats per rank counts 2·s·W). With one worker no
// collective runs, yet floats sent keeps the paper's definition.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "compress/compressor.h"
#include "compress/traffic.h"

namespace accordion {

struct ReducerOptions {
  Compressor compressor = Compressor::None;
  // Initial level of every compressible parameter: the rank for PowerSGD, the ratio K for TopK.
  double level = 1;
  // Seed of PowerSGD's initial Q; identical on every worker.
  uint64_t seed = 42;
  // PowerSGD leaves a matrix dense unless (n + m)·r·rate < n·m (PyTorch's min_compression_rate);
  // 0 compresses every matrix.
  double minCompressionRate = 1.0;
  float orthogonalizationEps = 1e-8f;
  // Keep Σ_t g_t per parameter over the epoch (Accordion's norms).
  bool accumulateNorms = false;
  // The precision the gradients, P and Q, and TopK's values travel in (host memory only).
  Precision sent = Precision::Fp32;
  // Buckets of the exchange overlapped with backward (Session, compress/bucket_exchange.h): at most
  // this many bytes of gradients each; 0 exchanges everything after backward.
  int64_t bucketBytes = 0;
};

// A step's exchange in buckets, overlapped with backward (compress/bucket_exchange.h), by
// compress/traffic.h's rule over the parameters' gradients. Exchanging a bucket is exactly reduce()
// on its parameters, so bucketing changes no number but the order in which the collectives sum.
std::vector<std::vector<size_t>> gradientBuckets(const std::vector<Parameter*>& parameters, int64_t bytes);

struct ReduceResult {
  int64_t floatsSent = 0;
  int64_t bytesSent = 0;            // the floats sent at their size on the wire
  int64_t overheadFloats = 0;       // the finite-gradient agreement: W floats (4·W bytes) when W ≥ 2
  double communicationSeconds = 0;  // inside collectives; the rest of reduce() is compression
  std::vector<CollectiveTime> collectives;  // each collective's bytes sent and seconds, in the order they ran
  // Adds a finished group's time and collectives.
  void add(const TimedGroup& group) {
    communicationSeconds += group.seconds;
    collectives.insert(collectives.end(), group.times.begin(), group.times.end());
  }
};

// Orchestrates the exchange: levels, buckets, the finite agreement, collectives and accounting. The
// compressor's strategy owns its state; the arithmetic runs in the backend's kernels, on the device
// where the gradients are.
class GradientReducer {
 public:
  GradientReducer(std::vector<Parameter*> parameters, const ReducerOptions& options, ProcessGroup& group, Backend& backend);

  // Enqueues the NaN/Inf check of the local gradients: *firstBad (on the backend's device) becomes
  // 1 + the index of the first parameter whose gradient is not finite, or 0.
  void checkFinite(double* firstBad);
  // Replaces every parameter's `grad` by the averaged (decompressed) gradient, given this worker's
  // checkFinite result. The workers first agree on it: a NaN or Inf on any worker throws on every
  // worker, naming the parameter and rank, before any state is touched.
  ReduceResult reduce(int64_t firstBad);
  // checkFinite's result, waiting for the device.
  int64_t firstNonFinite();
  // reduce(firstNonFinite()).
  ReduceResult reduce() { return reduce(firstNonFinite()); }

  // The same exchange in buckets, one bucket (parameter indices) at a time, in the same bucket order
  // on every worker: a step is startBuckets(), reduceBucket() for each bucket, then finishBuckets().
  // A bucket's gradients are checked first (a non-finite one is noted and zeroed, so the collectives
  // still match); the state the bucket changes (memories, Q, gradient sums) is copied before it
  // changes. finishBuckets() is reduce()'s agreement on the step's first non-finite gradient: a bad
  // one on any worker restores the copies, then throws on every worker, as reduce() does.
  void startBuckets();
  void reduceBucket(const std::vector<size_t>& bucket, ReduceResult& result);
  void finishBuckets(ReduceResult& result);
  // Puts back the state the step's buckets changed (a step that fails before finishBuckets()).
  void restoreBuckets();

  Compressor compressor() const { return compressor_ ? compressor_->kind() : Compressor::None; }
  // Levels: PowerSGD rank (a positive integer) or TopK ratio in (0, 1]; 0 for parameters sent dense
  // (1-D ones always, a matrix when its level is set to 0); kDenseBf16 for a matrix sent dense in
  // bf16 with error feedback (compress/compressor.h).
  double level(size_t index) const { return slots_.at(index).level; }
  // Changing a level keeps the error-feedback memory and re-draws PowerSGD's Q from the shared seed;
  // setting the current level again changes nothing. A matrix set to 0 is sent dense from the next
  // step, its memory added to its first dense gradient (error feedback owes it) and then zero. A
  // matrix set to kDenseBf16 keeps its memory and adds it to every gradient it sends.
  void setLevel(size_t index, double level);
  // For every matrix, what each candidate level (0: dense) would cost on the sum of its raw local
  // gradients since the last takeGradientNorms(): the relative error of compressing that sum as one
  // worker's reduce() would from fresh state (zero memory, Q drawn from the shared seed; at
  // kDenseBf16, of rounding it to bf16), the floats sent per step and the kernels' seconds (none for
  // the dense levels: their rounding is part of the collective). Empty for 1-D parameters. Needs
  // accumulateNorms; leaves the sums, memories, Q and levels as they were.
  std::vector<std::vector<LevelCost>> levelCosts(const std::vector<double>& candidates);
  // Whether the parameter is compressed at its current level (PowerSGD's rate test may leave it dense).
  bool isCompressed(size_t index) const;
  // Floats this worker sends per step at the current levels, and their bytes on the wire.
  int64_t floatsPerStep() const;
  int64_t bytesPerStep() const;

  // Restarts error feedback as at construction: every memory zero and PowerSGD's Q drawn again from
  // the shared seed (benchmarks time one round on the same state again and again).
  void resetErrorFeedback();

  // ‖Σ_t g_t‖₂ per parameter since the last call (raw local gradients), then restarts the sums.
  std::vector<double> takeGradientNorms();

  size_t size() const { return slots_.size(); }
  const Parameter& parameter(size_t index) const { return *slots_.at(index).parameter; }
  // The compressor's state of a parameter, by key ("memory"; PowerSGD's "q"), on the backend's
  // device: what a checkpoint keeps. Empty for 1-D parameters and without a compressor.
  std::vector<std::pair<std::string, Tensor*>> compressorState(size_t index);
  // One of them by key, or null.
  Tensor* compressorState(size_t index, const std::string& key);
  // Validates a level for this reducer's compressor (0, dense, where allowed), throwing a clear error.
  void checkLevel(double level, const std::string& where, bool allowDense = true) const;

 private:
  struct Slot {
    Parameter* parameter;
    int64_t rows = 0, cols = 0;  // matrix view (shape[0], numel / shape[0])
    bool matrix = false;          // more than one dimension
    double level = 0;
    Tensor normSum;
    // A bucketed step's copy of the state it changes, taken before its bucket does: the
    // compressor's state (in compressorState's order), the gradient sum, whether a memory is owed.
    std::vector<Tensor> saved;
    Tensor savedNormSum;
    bool savedOwes = false, isSaved = false;
  };
  MatrixView view(size_t index, double level) const;
  MatrixView view(size_t index) const { return view(index, slots_[index].level); }
  // Workers agree on `firstBad`; throws naming the parameter and rank where any gradient is not finite.
  void agree(int64_t firstBad, ReduceResult& result, TimedGroup& group);
  // Compresses and exchanges the gradients of `slots` (after the agreement), adding to `result`.
  void exchange(const std::vector<size_t>& slots, ReduceResult& result);
  void save(size_t index);
  bool compressedAt(const Slot& s, double level) const;
  bool compressed(const Slot& s) const { return compressedAt(s, s.level); }
  // Whether a matrix at `level` is sent dense in bf16 with error feedback (kDenseBf16).
  bool roundedAt(const Slot& s, double level) const;
  // ‖G − round(G)‖ / ‖G‖ (0 for G = 0): what rounding `sum` to `p` loses, relative to it.
  double roundingError(const Tensor& sum, Precision p) const;
  // Floats and bytes of one parameter per step at `level`.
  int64_t floatsAt(const Slot& s, double level) const;
  int64_t bytesAt(const Slot& s, double level) const;
  // 1 + the position in `slots` of the first parameter whose gradient is not finite, or 0.
  int64_t firstNonFiniteAmong(const std::vector<size_t>& slots);
  // After an exchange in 16 bits: throws, naming the parameter, where a value left the precision's
  // range (fp16: beyond 65504) and came back as Inf. Every worker holds the same averages, so every
  // worker throws alike.
  void checkInRange(const std::vector<size_t>& slots);
  void reduceDense(const std::vector<size_t>& slots, TimedGroup& group);

  ReducerOptions options_;
  ProcessGroup& group_;
  Backend& backend_;
  std::vector<Parameter*> parameters_;
  std::unique_ptr<ErrorFeedbackCompressor> compressor_;  // null: every tensor dense
  std::vector<Slot> slots_;
  Tensor denseBuffer_, agreementBuffer_;
  Array<double> finiteFlag_;
  int64_t bucketsFirstBad_ = 0;  // of a bucketed step: 1 + the first non-finite parameter, or 0
};

}  // namespace accordion
