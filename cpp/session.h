// One process's training state: a model, its optimiser and the step that joins them.
#pragma once
#include <string>
#include <vector>

#include "batcher.h"
#include "models.h"
#include "optimizer.h"

namespace accordion {

struct StepResult {
  double loss = 0;  // mean over the samples
  int64_t correct = 0;
  int64_t samples = 0;
};

// A named tensor of the session's state as raw little-endian bytes (F32 or I64).
struct StateEntry {
  std::string name;
  std::string dtype;  // "F32" | "I64"
  Shape shape;
  std::vector<uint8_t> bytes;
};

class Session {
 public:
  Session(const ModelSpec& model, const SgdOptions& optimizer);

  Model& model() { return model_; }
  Sgd& optimizer() { return optimizer_; }

  // Forward, loss, backward and one optimiser update. A non-finite loss stops before the update.
  StepResult trainStep(const Batch& batch);
  // One pass over the batcher's current epoch in evaluation mode (running statistics, no dropout).
  StepResult evaluate(Batcher& batcher);
  // Logits (N, classes) for images given in PyTorch's layout (N, 3, H, W).
  Tensor predict(const float* imagesNchw, int64_t n, int64_t height, int64_t width);

  // The model's state_dict (names, shapes and dtypes as PyTorch's), optionally with the
  // optimiser's momentum buffers and the random streams ("optimizer." and "rng." prefixes).
  std::vector<StateEntry> state(bool includeTrainer) const;
  // Restores entries by name; every model entry must be present with the same shape and dtype.
  void loadState(const std::vector<StateEntry>& entries);

 private:
  Model model_;
  Sgd optimizer_;
  Tensor gradLogits_;
};

}  // namespace accordion
