// One process's training state: a model, its optimiser and the step that joins them.
#pragma once
#include <string>
#include <vector>

#include <memory>
#include <optional>

#include "batcher.h"
#include "compression.h"
#include "models.h"
#include "optimizer.h"

namespace accordion {

struct StepResult {
  double loss = 0;  // mean over the samples
  int64_t correct = 0;
  int64_t samples = 0;
  int64_t floatsSent = 0;  // by this worker in the gradient exchange
  // Where the step's time went: forward, backward and update; compressing and decompressing;
  // waiting in collectives.
  double computeSeconds = 0, compressionSeconds = 0, communicationSeconds = 0;
};

// A named tensor of the session's state as raw little-endian bytes (F32 or I64).
struct StateEntry {
  std::string name;
  std::string dtype;  // "F32" | "F64" | "I64"
  Shape shape;
  std::vector<uint8_t> bytes;
};

class Session {
 public:
  // `group` carries the gradient exchange; without one the session trains alone.
  Session(const ModelSpec& model, const SgdOptions& optimizer, const ReducerOptions& reducer = {},
          std::shared_ptr<ProcessGroup> group = nullptr);

  Model& model() { return model_; }
  Sgd& optimizer() { return optimizer_; }
  GradientReducer& reducer() { return *reducer_; }

  // One optimiser step from the batcher's next `microBatches` batches: forward and backward for
  // each, their mean gradient, the gradient exchange (with compression) and the update. A
  // non-finite loss or gradient stops before anything is updated. Nullopt at the epoch's end.
  std::optional<StepResult> trainStep(Batcher& batcher, int64_t microBatches = 1);
  // Language model: one optimiser step on a (T, B) window of input and target token ids, with the
  // local gradients clipped to a global norm of `clipNorm` (0: no clipping) before the exchange.
  StepResult trainTokens(const int32_t* inputs, const int32_t* targets, int64_t steps, int64_t batch, double clipNorm);
  // Language model: the loss of a window without any update (evaluation mode; states carried).
  StepResult evaluateTokens(const int32_t* inputs, const int32_t* targets, int64_t steps, int64_t batch);
  // One pass over the batcher's current epoch in evaluation mode (running statistics, no dropout).
  StepResult evaluate(Batcher& batcher);
  // Logits (N, classes) for images given in PyTorch's layout (N, 3, H, W).
  Tensor predict(const float* imagesNchw, int64_t n, int64_t height, int64_t width);

  // The model's state_dict (names, shapes and dtypes as PyTorch's), optionally with the trainer's
  // state: momentum buffers, compressor memories, Q and levels, random streams ("optimizer.",
  // "compressor." and "rng." prefixes).
  std::vector<StateEntry> state(bool includeTrainer) const;
  // Copies rank `root`'s parameters and running statistics to every worker of the group.
  void broadcastState(int root);
  ProcessGroup& group() { return *group_; }

  // Restores entries by name; every model entry must be present with the same shape and dtype.
  void loadState(const std::vector<StateEntry>& entries);

 private:
  Model model_;
  Sgd optimizer_;
  std::shared_ptr<ProcessGroup> group_;
  std::unique_ptr<GradientReducer> reducer_;
  LanguageModel& language();
  // Gradient exchange and update after the local gradients are in place; fills the step's timings.
  void exchangeAndUpdate(StepResult& result, double computeSecondsSoFar);

  Tensor gradLogits_;
  std::vector<Tensor> accumulated_;  // micro-batch gradient sums
};

}  // namespace accordion
