// The model zoo: CIFAR ResNet-18 and VGG-19bn with PyTorch's state_dict names.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "models/language_model.h"
#include "models/layers.h"

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

// A batch as a model consumes it: N images (N, 3, H, W) in the backend's layout on its device, or a
// (T, B) window of token ids in host memory (the embedding's backward reads them there); `labels`
// holds, on the device, the N labels or the window's T·B targets.
struct ModelInput {
  Tensor images;
  const int32_t* tokens = nullptr;
  int64_t steps = 0, columns = 0;
  Array<int32_t> labels;
};

// A vision model (a module tree over images) or the language model (over token windows), behind one
// training interface: forwardLoss, then backward.
class Model {
 public:
  Model(const ModelSpec& spec, Backend& backend);
  const ModelSpec& spec() const { return spec_; }
  // Forward and the mean cross-entropy of a batch in the current mode (setTraining): the loss and the
  // correct count go to status[0] and status[1] (device memory, read later); the loss's gradient is
  // kept for backward().
  void forwardLoss(const ModelInput& input, double* status);
  // Every parameter's gradient of the last forwardLoss. The hook set by setGradientsReady hears of
  // the parameters whose gradients are final, in the order backward finishes them, while it runs.
  void backward();
  void setGradientsReady(GradientsReady ready);
  // The logits of the last forwardLoss: (N, classes), or (T·B, vocabulary) for the language model.
  const Tensor& logits() const;
  void setTraining(bool training) {
    if (language_) language_->setTraining(training);
    else root_->setTraining(training);
  }
  bool training() const { return language_ ? language_->training() : root_->training(); }
  void freezeBatchNorm(bool frozen) {
    if (root_) root_->freezeBatchNorm(frozen);
  }
  // The language model, or nullptr for a vision model.
  LanguageModel* language() { return language_.get(); }
  StateRefs& state() { return state_; }
  std::vector<Parameter*>& parameters() { return state_.parameters; }
  int64_t parameterCount() const;
  // Random streams of the stochastic layers (dropout), for checkpoints.
  std::vector<Random*> randomStreams() { return randomStreams_; }

 private:
  ModelSpec spec_;
  Backend& ops_;
  std::unique_ptr<Sequential> root_;
  std::unique_ptr<LanguageModel> language_;
  StateRefs state_;
  std::vector<Random*> randomStreams_;
  Tensor logits_, gradLogits_;  // a vision model's last forward
  GradientsReady ready_;
  Module::BackwardHook moduleFinished_;  // a vision model's module hook, calling ready_
  std::map<const Module*, std::vector<Parameter*>> moduleParameters_;
};

std::vector<std::string> architectures();

}  // namespace accordion
