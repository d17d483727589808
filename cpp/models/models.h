// The model zoo: CIFAR ResNet-18 and VGG-19bn with PyTorch's state_dict names.
#pragma once
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
  // "lstm" only: hidden (= embedding) size, layers.
  int64_t hidden = 650, layers = 2;
  // Dropout probability of the LSTM (0.4 by default) and of VGG's classifier (0.5 by default).
  float dropout = 0.4f;
};

// A vision model (a module tree over images) or the language model (over token windows). A vision
// model runs on the backend it is built with; the language model runs on the CPU.
class Model {
 public:
  Model(const ModelSpec& spec, Backend& backend);
  const ModelSpec& spec() const { return spec_; }
  // images: (N, 3, H, W) in the backend's layout; returns logits (N, classes).
  Tensor forward(const Tensor& images) { return vision().forward(images); }
  void backward(const Tensor& gradLogits) { vision().backward(gradLogits); }
  // Vision models: `hook` hears of each module whose backward has returned (Module::setBackwardHook).
  void setBackwardHook(const Module::BackwardHook* hook) { vision().setBackwardHook(hook); }
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
  Module& vision() {
    if (!root_) throw invalidArgument("model '" + spec_.architecture + "' takes token windows, not images");
    return *root_;
  }
  ModelSpec spec_;
  std::unique_ptr<Sequential> root_;
  std::unique_ptr<LanguageModel> language_;
  StateRefs state_;
  std::vector<Random*> randomStreams_;
};

std::vector<std::string> architectures();

}  // namespace accordion
