// What a model trains: a network over a batch (images, or a window of token ids) behind one training
// interface, which the vision networks (models/models.cpp) and the language model
// (models/language_model.h) both implement.
#pragma once
#include <vector>

#include "models/layers.h"

namespace accordion {

// A batch as a network consumes it: N images (N, 3, H, W) in the backend's layout on its device, or a
// (T, B) window of token ids in host memory (the embedding's backward reads them there); `labels`
// holds, on the device, the N labels or the window's T·B targets.
struct ModelInput {
  Tensor images;
  const int32_t* tokens = nullptr;
  int64_t steps = 0, columns = 0;
  Array<int32_t> labels;
};

class Network {
 public:
  virtual ~Network() = default;
  // Forward and the mean cross-entropy of a batch in the current mode (setTraining): the loss and the
  // correct count go to status[0] and status[1] (device memory, read later); what backward needs is kept.
  virtual void forwardLoss(const ModelInput& input, double* status) = 0;
  // Every parameter's gradient of the last forwardLoss; `ready` (when not null) hears of the
  // parameters whose gradients are final, in the order backward finishes them, while it runs.
  virtual void backward(const GradientsReady* ready) = 0;
  // The logits of the last forwardLoss: (N, classes), or (T·B, vocabulary) for the language model.
  virtual const Tensor& logits() const = 0;
  virtual void setTraining(bool training) = 0;
  virtual bool training() const = 0;
  // Batch norm layers stop updating their running statistics (a network without them ignores it).
  virtual void freezeBatchNorm(bool) {}
  virtual StateRefs& state() = 0;
  // Random streams of the stochastic layers (dropout), for checkpoints.
  virtual std::vector<Random*> randomStreams() = 0;
};

}  // namespace accordion
