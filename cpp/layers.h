// Layers of the vision models. Each is a forward/backward pair: forward caches what backward needs,
// backward takes dL/d(output), writes dL/d(parameter) into each parameter's `grad` (overwriting it)
// and returns dL/d(input). 4-D activations are (N, C, H, W) stored channels-last (see tensor.h).
#pragma once
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <utility>
#include <vector>

#include "dnnl_context.h"
#include "random.h"
#include "tensor.h"

namespace accordion {

// Pointers into a model's state, in PyTorch's state_dict order.
struct StateRefs {
  std::vector<Parameter*> parameters;
  std::vector<Buffer*> buffers;
  std::vector<Counter> counters;
  // state_dict order interleaves parameters, buffers and counters per module; `order` lists
  // (kind, index) pairs: kind 0 parameter, 1 buffer, 2 counter.
  std::vector<std::pair<int, size_t>> order;
  void add(Parameter* p) { order.emplace_back(0, parameters.size()); parameters.push_back(p); }
  void add(Buffer* b) { order.emplace_back(1, buffers.size()); buffers.push_back(b); }
  void add(Counter c) { order.emplace_back(2, counters.size()); counters.push_back(c); }
};

class Module {
 public:
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& input) = 0;
  virtual Tensor backward(const Tensor& gradOutput) = 0;
  // Registers parameters and buffers under `prefix` (e.g. "layer1.0.").
  virtual void collectState(const std::string& prefix, StateRefs& refs) {}
  virtual void setTraining(bool training) { training_ = training; }
  bool training() const { return training_; }
  // Frozen batch norm normalises with its running statistics even while training (and leaves
  // them unchanged): batch-size-independent forward passes, e.g. to compare data-parallel runs.
  virtual void freezeBatchNorm(bool frozen) {}

 protected:
  bool training_ = true;
};

// PyTorch's default initialisation of Conv2d/Linear: kaiming_uniform(a=√5) for the weight, which is
// U(−1/√fan_in, 1/√fan_in), and the same bound for the bias.
void initUniformFanIn(Tensor& t, int64_t fanIn, Random& rng);

class Conv2d : public Module {
 public:
  Conv2d(int64_t inChannels, int64_t outChannels, int64_t kernel, int64_t stride, int64_t padding, bool bias, Random& rng);
  ~Conv2d() override;
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  void collectState(const std::string& prefix, StateRefs& refs) override;

  Parameter weight;  // (C_out, C_in, kH, kW)
  Parameter bias;    // (C_out,), undefined when the layer has no bias

 private:
  struct Plan;
  Plan& planFor(const Shape& inputShape);
  int64_t inChannels_, outChannels_, kernel_, stride_, padding_;
  bool hasBias_;
  std::unique_ptr<Plan> plan_;
  Tensor input_, output_, gradInput_;
};

class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t channels, float momentum = 0.1f, float eps = 1e-5f);
  ~BatchNorm2d() override;
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  void collectState(const std::string& prefix, StateRefs& refs) override;
  void setTraining(bool training) override { training_ = training && !frozen_; }
  void freezeBatchNorm(bool frozen) override {
    frozen_ = frozen;
    if (frozen) training_ = false;
  }

  Parameter weight;  // γ (C,)
  Parameter bias;    // β (C,)
  Buffer runningMean, runningVar;  // (C,)
  int64_t batchesTracked = 0;

 private:
  struct Plan;
  Plan& planFor(const Shape& inputShape, bool training);
  int64_t channels_;
  float momentum_, eps_;
  std::unique_ptr<Plan> plan_;
  Tensor input_, output_, gradInput_, batchMean_, batchVar_;
  bool forwardWasTraining_ = true;
  bool frozen_ = false;
};

class ReLU : public Module {
 public:
  // In place overwrites the input; safe when the producer's backward does not need its output.
  explicit ReLU(bool inPlace = false) : inPlace_(inPlace) {}
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 private:
  bool inPlace_;
  Tensor output_, gradInput_;
};

class MaxPool2d : public Module {
 public:
  MaxPool2d(int64_t kernel, int64_t stride, int64_t padding = 0);
  ~MaxPool2d() override;
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 private:
  struct Plan;
  Plan& planFor(const Shape& inputShape);
  int64_t kernel_, stride_, padding_;
  std::unique_ptr<Plan> plan_;
  Tensor output_, gradInput_;
};

// Adaptive average pooling to 1×1 followed by flattening: (N, C, H, W) → (N, C).
class GlobalAvgPool : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 private:
  Shape inputShape_;
  Tensor output_, gradInput_;
};

// (N, C, H, W) → (N, C·H·W) in PyTorch's (channel-major) order.
class Flatten : public Module {
 public:
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 private:
  Shape inputShape_;
  Tensor output_, gradInput_;
};

class Linear : public Module {
 public:
  Linear(int64_t inFeatures, int64_t outFeatures, Random& rng);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  void collectState(const std::string& prefix, StateRefs& refs) override;

  Parameter weight;  // (out, in)
  Parameter bias;    // (out,)

 private:
  int64_t in_, out_;
  Tensor input_, output_, gradInput_;
};

class Dropout : public Module {
 public:
  Dropout(float p, uint64_t seed) : p_(p), rng_(seed) {}
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  Random& rng() { return rng_; }

 private:
  float p_;
  Random rng_;
  std::vector<uint8_t> keep_;
  Tensor output_, gradInput_;
};

// Children run in order; names give the state_dict prefixes ("0", "1", … or explicit names).
class Sequential : public Module {
 public:
  Sequential& add(std::string name, std::unique_ptr<Module> module);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  void collectState(const std::string& prefix, StateRefs& refs) override;
  void setTraining(bool training) override;
  void freezeBatchNorm(bool frozen) override;
  bool empty() const { return children_.empty(); }
  size_t size() const { return children_.size(); }

 private:
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
};

// ResNet's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
class BasicBlock : public Module {
 public:
  BasicBlock(int64_t inPlanes, int64_t planes, int64_t stride, Random& rng);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  void collectState(const std::string& prefix, StateRefs& refs) override;
  void setTraining(bool training) override;
  void freezeBatchNorm(bool frozen) override;

 private:
  Sequential main_;      // conv1, bn1, relu, conv2, bn2
  Sequential shortcut_;  // empty (identity) or conv 1×1 + bn
  ReLU outRelu_{true};
  Tensor gradInput_;
};

// Mean softmax cross-entropy over the batch. Writes dL/dlogits into `gradLogits` and returns the loss;
// `correct` receives the number of rows whose arg-max equals the label.
double softmaxCrossEntropy(const Tensor& logits, const int32_t* labels, Tensor& gradLogits, int64_t* correct);

// Layout conversions at the engine's boundary (user data is NCHW).
void nchwToNhwc(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w);
void nhwcToNchw(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w);

}  // namespace accordion
