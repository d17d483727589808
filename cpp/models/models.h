// The model zoo: CIFAR ResNet-18 and VGG-19bn with PyTorch's state_dict names.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/language_model.h"
#include "models/network.h"

namespace accordion {

struct ModelSpec {
  std::string architecture;  // "resnet18" | "vgg19bn" | "lstm"
  int64_t classes = 10;      // the vocabulary size for "lstm"
  uint64_t seed = 0;
  // "resnet18", "vgg19bn": every convolution's output channels × width, rounded, at least 1.
  double width = 1.0;
  // "lstm" only: hidden (= embedding) size, layers.
  int64_t hidden = 650, layers = 2;
  // Dropout probability of the LSTM (0.4 by default) and of VGG's classifier (0.5 by default).
  float dropout = 0.4f;
};

// A model of the zoo: its network built from a spec, behind the one training interface (network.h).
class Model {
 public:
  Model(const ModelSpec& spec, Backend& backend);
  const ModelSpec& spec() const { return spec_; }
  void forwardLoss(const ModelInput& input, double* status) { net_->forwardLoss(input, status); }
  // Every parameter's gradient of the last forwardLoss. The hook set by setGradientsReady hears of
  // the parameters whose gradients are final, in the order backward finishes them, while it runs.
  void backward() { net_->backward(ready_ ? &ready_ : nullptr); }
  void setGradientsReady(GradientsReady ready) { ready_ = std::move(ready); }
  const Tensor& logits() const { return net_->logits(); }
  void setTraining(bool training) { net_->setTraining(training); }
  bool training() const { return net_->training(); }
  void freezeBatchNorm(bool frozen) { net_->freezeBatchNorm(frozen); }
  // The language model, or nullptr for a vision model.
  LanguageModel* language() { return dynamic_cast<LanguageModel*>(net_.get()); }
  StateRefs& state() { return net_->state(); }
  std::vector<Parameter*>& parameters() { return net_->state().parameters; }
  std::vector<Random*> randomStreams() { return net_->randomStreams(); }

 private:
  ModelSpec spec_;
  std::unique_ptr<Network> net_;
  GradientsReady ready_;
};

std::vector<std::string> architectures();

}  // namespace accordion
