// The model zoo: CIFAR ResNet-18 and VGG-19bn with PyTorch's state_dict names.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "layers.h"

namespace accordion {

struct ModelSpec {
  std::string architecture;  // "resnet18" | "vgg19bn"
  int64_t classes = 10;
  uint64_t seed = 0;
};

class Model {
 public:
  explicit Model(const ModelSpec& spec);
  const ModelSpec& spec() const { return spec_; }
  // images: (N, 3, H, W) channels-last; returns logits (N, classes).
  Tensor forward(const Tensor& images) { return root_->forward(images); }
  void backward(const Tensor& gradLogits) { root_->backward(gradLogits); }
  void setTraining(bool training) { root_->setTraining(training); }
  bool training() const { return root_->training(); }
  void freezeBatchNorm(bool frozen) { root_->freezeBatchNorm(frozen); }
  StateRefs& state() { return state_; }
  std::vector<Parameter*>& parameters() { return state_.parameters; }
  int64_t parameterCount() const;
  // Random streams of the stochastic layers (dropout), for checkpoints.
  std::vector<Random*> randomStreams() { return randomStreams_; }

 private:
  ModelSpec spec_;
  std::unique_ptr<Sequential> root_;
  StateRefs state_;
  std::vector<Random*> randomStreams_;
};

std::vector<std::string> architectures();

}  // namespace accordion
