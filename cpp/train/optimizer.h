// SGD with momentum and weight decay, with PyTorch's semantics (torch.optim.SGD, dampening 0):
//   d = g + wd·p;  buf = d at the first step, else buf = m·buf + d;
//   step = d + m·buf (Nesterov) or buf (heavy ball);  p −= lr·step.
// The update of every parameter is one fused op on the parameters' device.
#pragma once
#include <vector>

#include "core/tensor.h"
#include "ops/backend.h"

namespace accordion {

struct SgdOptions {
  double learningRate = 0.1;
  double momentum = 0.9;
  double weightDecay = 1e-4;
  bool nesterov = true;
};

class Sgd {
 public:
  Sgd(std::vector<Parameter*> parameters, SgdOptions options, Backend& backend);
  // Applies one update from each parameter's `grad`.
  void step();
  void setLearningRate(double lr) { options_.learningRate = lr; }
  const SgdOptions& options() const { return options_; }
  // Momentum buffers (one per parameter, same shape, on the backend's device) and whether they
  // have been initialised.
  std::vector<Tensor>& momentumBuffers() { return buffers_; }
  bool started() const { return started_; }
  void setStarted(bool started) { started_ = started; }

 private:
  std::vector<Parameter*> parameters_;
  SgdOptions options_;
  Backend& backend_;
  std::vector<Tensor> buffers_;
  bool started_ = false;
};

}  // namespace accordion
