// Layers of the vision models. Each is a forward/backward pair: forward caches what backward needs,
// backward takes dL/d(output), writes dL/d(parameter) into each parameter's `grad` (overwriting it)
// and returns dL/d(input) in a tensor of its own, which lives only until the caller drops it: the
// backend's pool hands its memory to the next gradient of that size, so backward holds a few
// gradients at a time rather than one per layer. A layer keeps only what its own backward reads
// (a ReLU its output, most layers their input), and backward lets go of it once used, so that
// backward frees the activations as it passes and none outlives its step; an output nobody keeps
// (a shortcut's batch norm, once the residual add has read it) goes as soon as it is read. Layers run their ops on the backend they were
// built with and never ask which device that is; 4-D activations are (N, C, H, W) in the backend's
// layout.
//
// Parameters are created and initialised on the host (so every device starts from the same
// weights) and moved to the backend's device by placeState().
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/random.h"
#include "core/tensor.h"
#include "ops/backend.h"

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

// Moves every parameter value and buffer to the backend's device (a no-op on the CPU) and gives
// each parameter a zeroed gradient there.
void placeState(StateRefs& refs, Backend& backend);

// Hears, while backward runs, of parameters whose gradients are final (the overlapped exchange).
using GradientsReady = std::function<void(const std::vector<Parameter*>&)>;

class Module {
 public:
  explicit Module(Backend& ops) : ops_(ops) {}
  virtual ~Module() = default;
  virtual Tensor forward(const Tensor& input) = 0;
  virtual Tensor backward(const Tensor& gradOutput) = 0;
  // A container's children, each with the part of the state_dict prefix it adds ("0.", "shortcut.",
  // or "" for a child whose names stand directly under the container's). The calls below pass
  // through them by default.
  using ChildVisitor = std::function<void(const std::string& prefix, Module& child)>;
  virtual void forEachChild(const ChildVisitor& visit) {}
  // Registers parameters and buffers under `prefix` (e.g. "layer1.0."), naming them.
  virtual void collectState(const std::string& prefix, StateRefs& refs);
  // Appends the module's trainable parameters (its children's included) in state_dict order.
  virtual void addParameters(std::vector<Parameter*>& out);
  virtual void setTraining(bool training);
  bool training() const { return training_; }
  // Frozen batch norm normalises with its running statistics even while training (and leaves
  // them unchanged): batch-size-independent forward passes, e.g. to compare data-parallel runs.
  virtual void freezeBatchNorm(bool frozen);
  // Containers call `hook` with each child whose backward has just returned: that child's
  // parameter gradients are final (the overlapped gradient exchange listens). Null: no calls.
  using BackwardHook = std::function<void(Module&)>;
  virtual void setBackwardHook(const BackwardHook* hook);

 protected:
  Backend& ops_;
  bool training_ = true;
};

// The ops a layer has prepared, one per input shape it has seen (training and evaluation batches
// differ in size), so each shape is planned once.
template <typename Op>
class PreparedOps {
 public:
  template <typename Make>
  Op& get(const Shape& shape, Make&& make) {
    for (auto& [s, op] : ops_)
      if (s == shape) return *op;
    if (ops_.size() == kMaxShapes) ops_.erase(ops_.begin());
    ops_.emplace_back(shape, make());
    return *ops_.back().second;
  }

 private:
  static constexpr size_t kMaxShapes = 4;
  std::vector<std::pair<Shape, std::unique_ptr<Op>>> ops_;
};

// PyTorch's default initialisation of Conv2d/Linear: kaiming_uniform(a=√5) for the weight, which is
// U(−1/√fan_in, 1/√fan_in), and the same bound for the bias.
void initUniformFanIn(Tensor& t, int64_t fanIn, Random& rng);

class Conv2d : public Module {
 public:
  Conv2d(Backend& ops, int64_t inChannels, int64_t outChannels, int64_t kernel, int64_t stride, int64_t padding, bool bias,
         Random& rng);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  void collectState(const std::string& prefix, StateRefs& refs) override;
  void addParameters(std::vector<Parameter*>& out) override;
  // The network's first layer: nobody needs the gradient of its input, so backward skips it.
  void skipInputGradient() { skipInputGradient_ = true; }

  Parameter weight;  // (C_out, C_in, kH, kW)
  Parameter bias;    // (C_out,), undefined when the layer has no bias

 private:
  Conv2dSpec spec_;  // of the last input
  PreparedOps<Conv2dOp> prepared_;
  Conv2dOp* op_ = nullptr;
  bool skipInputGradient_ = false;
  Tensor input_;
};

// What follows a batch norm inside its op: nothing, or the ReLU after it (BatchNormSpec::relu), one
// module where PyTorch has two, with the batch norm's state_dict names (a ReLU has none).
enum class Activation { None, Relu };

class BatchNorm2d : public Module {
 public:
  BatchNorm2d(Backend& ops, int64_t channels, Activation activation = Activation::None, float momentum = 0.1f, float eps = 1e-5f);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  void collectState(const std::string& prefix, StateRefs& refs) override;
  void addParameters(std::vector<Parameter*>& out) override;
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
  BatchNormSpec spec_;  // of the last input
  PreparedOps<BatchNorm2dOp> prepared_;
  BatchNorm2dOp* op_ = nullptr;
  Tensor input_, batchMean_, batchVar_;
  bool forwardWasTraining_ = true;
  bool frozen_ = false;
};

class ReLU : public Module {
 public:
  // In place overwrites the input; safe when the producer's backward does not need its output.
  ReLU(Backend& ops, bool inPlace = false) : Module(ops), inPlace_(inPlace) {}
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 private:
  bool inPlace_;
  Tensor output_;
};

class MaxPool2d : public Module {
 public:
  MaxPool2d(Backend& ops, int64_t kernel, int64_t stride, int64_t padding = 0);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 private:
  Pool2dSpec spec_;  // of the last input
  PreparedOps<MaxPool2dOp> prepared_;
  MaxPool2dOp* op_ = nullptr;
};

// Images to rows, (N, C, H, W) → (N, features): kAverage averages over H·W (adaptive average
// pooling to 1×1, then flattening: ResNet's head, features = C); kFlatten keeps every value in
// PyTorch's channel-major order (VGG's, features = C·H·W).
class ImagesToRows : public Module {
 public:
  enum Mode { kAverage, kFlatten };
  ImagesToRows(Backend& ops, Mode mode) : Module(ops), mode_(mode) {}
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;

 private:
  Mode mode_;
  Shape inputShape_;
};

class Linear : public Module {
 public:
  Linear(Backend& ops, int64_t inFeatures, int64_t outFeatures, Random& rng);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  void collectState(const std::string& prefix, StateRefs& refs) override;
  void addParameters(std::vector<Parameter*>& out) override;

  Parameter weight;  // (out, in)
  Parameter bias;    // (out,)

 private:
  int64_t in_, out_;
  Tensor input_;
};

// The mask is drawn on the device from a key of the layer's own stream (ops/dropout_mask.h), the
// same mask on every device, so a model trains alike on each and its checkpoints carry one stream
// state.
class Dropout : public Module {
 public:
  Dropout(Backend& ops, float p, uint64_t seed);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  Random& rng() { return rng_; }

 private:
  float p_;
  Random rng_;
  Array<uint8_t> keep_;  // the mask, on the device
};

// Children run in order; names give the state_dict prefixes ("0", "1", … or explicit names).
class Sequential : public Module {
 public:
  using Module::Module;
  Sequential& add(std::string name, std::unique_ptr<Module> module);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  void forEachChild(const ChildVisitor& visit) override;
  void setBackwardHook(const BackwardHook* hook) override;
  bool empty() const { return children_.empty(); }
  size_t size() const { return children_.size(); }

 private:
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  const BackwardHook* hook_ = nullptr;
};

// ResNet's BasicBlock: relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
class BasicBlock : public Module {
 public:
  BasicBlock(Backend& ops, int64_t inPlanes, int64_t planes, int64_t stride, Random& rng);
  Tensor forward(const Tensor& input) override;
  Tensor backward(const Tensor& gradOutput) override;
  void forEachChild(const ChildVisitor& visit) override;

 private:
  Sequential main_;      // conv1, bn1 (with its ReLU), conv2, bn2
  Sequential shortcut_;  // empty (identity) or conv 1×1 + bn
  ReLU outRelu_;
};

}  // namespace accordion
