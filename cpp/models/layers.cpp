#include "models/layers.h"

#include <cmath>
#include <string>

#include "core/errors.h"

namespace accordion {

namespace {
// What a forward kept for its backward. Backward lets it go once used, so that the backend's pool
// hands the memory to the gradients still to come and to the next forward, as autograd frees a
// tensor it saved once its backward has run: a second backward needs a forward before it.
const Tensor& kept(const Tensor& t, const char* layer) {
  if (!t.defined()) throw EngineError("ERR_INVALID_STATE", std::string(layer) + " backward without a forward since the last backward");
  return t;
}
}  // namespace

void initUniformFanIn(Tensor& t, int64_t fanIn, Random& rng) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(fanIn));
  float* p = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng.uniform(-bound, bound);
}

void placeState(StateRefs& refs, Backend& backend) {
  for (Parameter* p : refs.parameters) {
    p->value = backend.toDevice(p->value);
    p->grad = backend.zeros(p->value.shape());
  }
  for (Buffer* b : refs.buffers) b->value = backend.toDevice(b->value);
}

void Module::collectState(const std::string& prefix, StateRefs& refs) {
  forEachChild([&](const std::string& name, Module& child) { child.collectState(prefix + name, refs); });
}

void Module::addParameters(std::vector<Parameter*>& out) {
  forEachChild([&](const std::string&, Module& child) { child.addParameters(out); });
}

void Module::setTraining(bool training) {
  training_ = training;
  forEachChild([&](const std::string&, Module& child) { child.setTraining(training); });
}

void Module::freezeBatchNorm(bool frozen) {
  forEachChild([&](const std::string&, Module& child) { child.freezeBatchNorm(frozen); });
}

void Module::setBackwardHook(const BackwardHook* hook) {
  forEachChild([&](const std::string&, Module& child) { child.setBackwardHook(hook); });
}

static void requireActivation(const Tensor& x, int64_t channels, const char* layer) {
  bool empty = false;
  for (int64_t d : x.shape()) empty = empty || d < 1;
  if (x.rank() != 4 || empty || (channels > 0 && x.dim(1) != channels))
    throw invalidArgument(std::string(layer) + " expects input (N, " + (channels > 0 ? std::to_string(channels) : "C") +
                          ", H, W) with every dimension ≥ 1, got " + shapeString(x.shape()));
}

// A layer's size argument: checked when the layer is built, before any arithmetic uses it.
static void requireAtLeast(int64_t value, int64_t min, const char* layer, const char* what) {
  if (value < min)
    throw invalidArgument(std::string(layer) + ": " + what + " must be at least " + std::to_string(min) + ", got " + std::to_string(value));
}

// A window of `kernel` (with `padding` on both sides) must fit in an input side of `size`.
static bool windowFits(int64_t size, int64_t kernel, int64_t padding) { return size + 2 * padding >= kernel; }

// ---------------------------------------------------------------------------------------------

Conv2d::Conv2d(Backend& ops, int64_t inChannels, int64_t outChannels, int64_t kernel, int64_t stride, int64_t padding, bool bias,
               Random& rng)
    : Module(ops) {
  requireAtLeast(inChannels, 1, "Conv2d", "in channels");
  requireAtLeast(outChannels, 1, "Conv2d", "out channels");
  requireAtLeast(kernel, 1, "Conv2d", "kernel");
  requireAtLeast(stride, 1, "Conv2d", "stride");
  requireAtLeast(padding, 0, "Conv2d", "padding");
  spec_.inChannels = inChannels;
  spec_.outChannels = outChannels;
  spec_.kernel = kernel;
  spec_.stride = stride;
  spec_.padding = padding;
  spec_.bias = bias;
  weight.value = Tensor({outChannels, inChannels, kernel, kernel});
  weight.grad = Tensor::zeros(weight.value.shape());
  const int64_t fanIn = inChannels * kernel * kernel;
  initUniformFanIn(weight.value, fanIn, rng);
  if (bias) {
    this->bias.value = Tensor({outChannels});
    this->bias.grad = Tensor::zeros({outChannels});
    initUniformFanIn(this->bias.value, fanIn, rng);
  }
}

void Conv2d::addParameters(std::vector<Parameter*>& out) {
  out.push_back(&weight);
  if (spec_.bias) out.push_back(&bias);
}

void Conv2d::collectState(const std::string& prefix, StateRefs& refs) {
  weight.name = prefix + "weight";
  refs.add(&weight);
  if (spec_.bias) {
    bias.name = prefix + "bias";
    refs.add(&bias);
  }
}

Tensor Conv2d::forward(const Tensor& input) {
  requireActivation(input, spec_.inChannels, "Conv2d");
  if (!op_ || spec_.inputShape() != input.shape()) {
    Conv2dSpec spec = spec_;
    spec.batch = input.dim(0), spec.height = input.dim(2), spec.width = input.dim(3);
    if (!windowFits(spec.height, spec.kernel, spec.padding) || !windowFits(spec.width, spec.kernel, spec.padding))
      throw invalidArgument("Conv2d input " + shapeString(input.shape()) + " is smaller than the kernel");
    op_ = &prepared_.get(input.shape(), [&] { return ops_.conv2d(spec); });
    spec_ = spec;
  }
  input_ = input;
  Tensor output(spec_.outputShape(), ops_);
  op_->forward(input.data(), weight.value.data(), spec_.bias ? bias.value.data() : nullptr, output.data());
  return output;
}

Tensor Conv2d::backward(const Tensor& gradOutput) {
  const Tensor& input = kept(input_, "Conv2d");
  Tensor gradInput = skipInputGradient_ ? Tensor() : Tensor(spec_.inputShape(), ops_);
  op_->backward(input.data(), weight.value.data(), gradOutput.data(), gradInput.data(), weight.grad.data(),
                spec_.bias ? bias.grad.data() : nullptr);
  input_ = Tensor();
  return gradInput;
}

// ---------------------------------------------------------------------------------------------

BatchNorm2d::BatchNorm2d(Backend& ops, int64_t channels, Activation activation, float momentum, float eps) : Module(ops) {
  requireAtLeast(channels, 1, "BatchNorm2d", "channels");
  spec_.channels = channels;
  spec_.relu = activation == Activation::Relu;
  spec_.momentum = momentum;
  spec_.eps = eps;
  weight.value = Tensor({channels});
  weight.value.fill(1.0f);
  weight.grad = Tensor::zeros({channels});
  bias.value = Tensor::zeros({channels});
  bias.grad = Tensor::zeros({channels});
  runningMean.value = Tensor::zeros({channels});
  runningVar.value = Tensor({channels});
  runningVar.value.fill(1.0f);
}

void BatchNorm2d::addParameters(std::vector<Parameter*>& out) {
  out.push_back(&weight);
  out.push_back(&bias);
}

void BatchNorm2d::collectState(const std::string& prefix, StateRefs& refs) {
  weight.name = prefix + "weight";
  bias.name = prefix + "bias";
  runningMean.name = prefix + "running_mean";
  runningVar.name = prefix + "running_var";
  refs.add(&weight);
  refs.add(&bias);
  refs.add(&runningMean);
  refs.add(&runningVar);
  refs.add(Counter{prefix + "num_batches_tracked", &batchesTracked});
}

Tensor BatchNorm2d::forward(const Tensor& input) {
  requireActivation(input, spec_.channels, "BatchNorm2d");
  if (!op_ || spec_.shape() != input.shape()) {
    spec_.batch = input.dim(0), spec_.height = input.dim(2), spec_.width = input.dim(3);
    op_ = &prepared_.get(input.shape(), [&] { return ops_.batchNorm2d(spec_); });
  }
  input_ = input;
  forwardWasTraining_ = training_;
  Tensor output(input.shape(), ops_);
  if (training_) {
    ensureShape(batchMean_, {spec_.channels}, ops_);
    ensureShape(batchVar_, {spec_.channels}, ops_);
    op_->forwardTraining(input.data(), weight.value.data(), bias.value.data(), output.data(), batchMean_.data(), batchVar_.data(),
                         runningMean.value.data(), runningVar.value.data());
    ++batchesTracked;
  } else {
    op_->forwardInference(input.data(), weight.value.data(), bias.value.data(), runningMean.value.data(),
                          runningVar.value.data(), output.data());
  }
  return output;
}

Tensor BatchNorm2d::backward(const Tensor& gradOutput) {
  const Tensor& input = kept(input_, "BatchNorm2d");
  Tensor gradInput(input.shape(), ops_);
  const Tensor& mean = forwardWasTraining_ ? batchMean_ : runningMean.value;
  const Tensor& var = forwardWasTraining_ ? batchVar_ : runningVar.value;
  op_->backward(input.data(), gradOutput.data(), weight.value.data(), bias.value.data(), mean.data(), var.data(),
                forwardWasTraining_, gradInput.data(), weight.grad.data(), bias.grad.data());
  input_ = Tensor();
  return gradInput;
}

// ---------------------------------------------------------------------------------------------

Tensor ReLU::forward(const Tensor& input) {
  output_ = inPlace_ ? input : Tensor(input.shape(), ops_);
  ops_.reluForward(input.data(), output_.data(), input.numel());
  return output_;
}

Tensor ReLU::backward(const Tensor& gradOutput) {
  const Tensor& output = kept(output_, "ReLU");
  Tensor gradInput(output.shape(), ops_);
  ops_.reluBackward(output.data(), gradOutput.data(), gradInput.data(), output.numel());
  output_ = Tensor();
  return gradInput;
}

// ---------------------------------------------------------------------------------------------

MaxPool2d::MaxPool2d(Backend& ops, int64_t kernel, int64_t stride, int64_t padding) : Module(ops) {
  requireAtLeast(kernel, 1, "MaxPool2d", "kernel");
  requireAtLeast(stride, 1, "MaxPool2d", "stride");
  requireAtLeast(padding, 0, "MaxPool2d", "padding");
  // As torch.nn.MaxPool2d: a window must overlap the input, so padding is at most half the kernel.
  if (2 * padding > kernel)
    throw invalidArgument("MaxPool2d: padding must be at most half the kernel, got padding " + std::to_string(padding) + " and kernel " +
                          std::to_string(kernel));
  spec_.kernel = kernel;
  spec_.stride = stride;
  spec_.padding = padding;
}

Tensor MaxPool2d::forward(const Tensor& input) {
  requireActivation(input, 0, "MaxPool2d");
  if (!op_ || spec_.inputShape() != input.shape()) {
    Pool2dSpec spec = spec_;
    spec.batch = input.dim(0), spec.channels = input.dim(1), spec.height = input.dim(2), spec.width = input.dim(3);
    if (!windowFits(spec.height, spec.kernel, spec.padding) || !windowFits(spec.width, spec.kernel, spec.padding))
      throw invalidArgument("MaxPool2d input " + shapeString(input.shape()) + " is smaller than the window");
    op_ = &prepared_.get(input.shape(), [&] { return ops_.maxPool2d(spec); });
    spec_ = spec;
  }
  Tensor output(spec_.outputShape(), ops_);
  op_->forward(input.data(), output.data());
  return output;
}

Tensor MaxPool2d::backward(const Tensor& gradOutput) {
  Tensor gradInput(spec_.inputShape(), ops_);
  op_->backward(gradOutput.data(), gradInput.data());  // the op keeps the forward's choices
  return gradInput;
}

// ---------------------------------------------------------------------------------------------

Tensor ImagesToRows::forward(const Tensor& input) {
  requireActivation(input, 0, mode_ == kAverage ? "GlobalAvgPool" : "Flatten");
  inputShape_ = input.shape();
  const int64_t n = input.dim(0), c = input.dim(1), h = input.dim(2), w = input.dim(3);
  if (mode_ == kAverage) {
    Tensor output({n, c}, ops_);
    ops_.globalAvgPoolForward(input.data(), output.data(), n, c, h, w);
    return output;
  }
  if (h * w == 1) return input.reshaped({n, c});  // the same order in every layout
  Tensor output({n, c * h * w}, ops_);
  ops_.flattenForward(input.data(), output.data(), n, c, h, w);
  return output;
}

Tensor ImagesToRows::backward(const Tensor& gradOutput) {
  const int64_t n = inputShape_[0], c = inputShape_[1], h = inputShape_[2], w = inputShape_[3];
  if (mode_ == kFlatten && h * w == 1) return gradOutput.reshaped(inputShape_);
  Tensor gradInput(inputShape_, ops_);
  if (mode_ == kAverage)
    ops_.globalAvgPoolBackward(gradOutput.data(), gradInput.data(), n, c, h, w);
  else
    ops_.flattenBackward(gradOutput.data(), gradInput.data(), n, c, h, w);
  return gradInput;
}

// ---------------------------------------------------------------------------------------------

Linear::Linear(Backend& ops, int64_t inFeatures, int64_t outFeatures, Random& rng) : Module(ops), in_(inFeatures), out_(outFeatures) {
  requireAtLeast(inFeatures, 1, "Linear", "in features");
  requireAtLeast(outFeatures, 1, "Linear", "out features");
  weight.value = Tensor({outFeatures, inFeatures});
  weight.grad = Tensor::zeros({outFeatures, inFeatures});
  bias.value = Tensor({outFeatures});
  bias.grad = Tensor::zeros({outFeatures});
  initUniformFanIn(weight.value, inFeatures, rng);
  initUniformFanIn(bias.value, inFeatures, rng);
}

void Linear::addParameters(std::vector<Parameter*>& out) {
  out.push_back(&weight);
  out.push_back(&bias);
}

void Linear::collectState(const std::string& prefix, StateRefs& refs) {
  weight.name = prefix + "weight";
  bias.name = prefix + "bias";
  refs.add(&weight);
  refs.add(&bias);
}

Tensor Linear::forward(const Tensor& input) {
  if (input.rank() != 2 || input.dim(0) < 1 || input.dim(1) != in_)
    throw invalidArgument("Linear expects input (N, " + std::to_string(in_) + ") with N ≥ 1, got " + shapeString(input.shape()));
  const int64_t n = input.dim(0);
  input_ = input;
  Tensor output({n, out_}, ops_);
  ops_.linearForward(input.data(), weight.value.data(), bias.value.data(), output.data(), n, in_, out_);
  return output;
}

Tensor Linear::backward(const Tensor& gradOutput) {
  const Tensor& input = kept(input_, "Linear");
  const int64_t n = input.dim(0);
  Tensor gradInput({n, in_}, ops_);
  ops_.linearBackward(input.data(), weight.value.data(), gradOutput.data(), gradInput.data(), weight.grad.data(),
                      bias.grad.data(), n, in_, out_);
  input_ = Tensor();
  return gradInput;
}

// ---------------------------------------------------------------------------------------------

Dropout::Dropout(Backend& ops, float p, uint64_t seed) : Module(ops), p_(p), rng_(seed) {
  if (!(p >= 0.0f && p < 1.0f)) throw invalidArgument("Dropout: p must lie in [0, 1), got " + std::to_string(p));
}

Tensor Dropout::forward(const Tensor& input) {
  if (!training_ || p_ == 0.0f) return input;
  const int64_t n = input.numel();
  Tensor output(input.shape(), ops_);
  ensureSize(keep_, n, ops_);
  ops_.dropoutMask(rng_.next(), p_, keep_.data(), n);
  ops_.dropoutForward(input.data(), keep_.data(), output.data(), n, 1.0f / (1.0f - p_));
  return output;
}

Tensor Dropout::backward(const Tensor& gradOutput) {
  if (!training_ || p_ == 0.0f) return gradOutput;
  Tensor gradInput(gradOutput.shape(), ops_);
  ops_.dropoutBackward(gradOutput.data(), keep_.data(), gradInput.data(), gradOutput.numel(), 1.0f / (1.0f - p_));
  return gradInput;
}

// ---------------------------------------------------------------------------------------------

Sequential& Sequential::add(std::string name, std::unique_ptr<Module> module) {
  children_.emplace_back(std::move(name), std::move(module));
  return *this;
}

Tensor Sequential::forward(const Tensor& input) {
  Tensor x = input;
  for (auto& [name, child] : children_) x = child->forward(x);
  return x;
}

Tensor Sequential::backward(const Tensor& gradOutput) {
  Tensor g = gradOutput;
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) {
    g = it->second->backward(g);
    if (hook_) (*hook_)(*it->second);
  }
  return g;
}

void Sequential::setBackwardHook(const BackwardHook* hook) {
  hook_ = hook;
  Module::setBackwardHook(hook);
}

void Sequential::forEachChild(const ChildVisitor& visit) {
  for (auto& [name, child] : children_) visit(name + ".", *child);
}

// ---------------------------------------------------------------------------------------------

BasicBlock::BasicBlock(Backend& ops, int64_t inPlanes, int64_t planes, int64_t stride, Random& rng)
    : Module(ops), main_(ops), shortcut_(ops), outRelu_(ops, true) {
  requireAtLeast(inPlanes, 1, "BasicBlock", "in planes");
  requireAtLeast(planes, 1, "BasicBlock", "planes");
  requireAtLeast(stride, 1, "BasicBlock", "stride");
  main_.add("conv1", std::make_unique<Conv2d>(ops, inPlanes, planes, 3, stride, 1, false, rng))
      .add("bn1", std::make_unique<BatchNorm2d>(ops, planes, Activation::Relu))
      .add("conv2", std::make_unique<Conv2d>(ops, planes, planes, 3, 1, 1, false, rng))
      .add("bn2", std::make_unique<BatchNorm2d>(ops, planes));
  if (stride != 1 || inPlanes != planes) {
    shortcut_.add("0", std::make_unique<Conv2d>(ops, inPlanes, planes, 1, stride, 0, false, rng))
        .add("1", std::make_unique<BatchNorm2d>(ops, planes));
  }
}

void BasicBlock::forEachChild(const ChildVisitor& visit) {
  visit("", main_);  // conv1, bn1, conv2, bn2 directly under the block's prefix
  visit("shortcut.", shortcut_);
}

Tensor BasicBlock::forward(const Tensor& input) {
  Tensor sum = main_.forward(input);  // bn2's output buffer, which bn2's backward does not need
  Tensor skip = shortcut_.empty() ? input : shortcut_.forward(input);
  ops_.addInPlace(sum.data(), skip.data(), sum.numel());
  return outRelu_.forward(sum);
}

Tensor BasicBlock::backward(const Tensor& gradOutput) {
  Tensor gradSum = outRelu_.backward(gradOutput);
  Tensor gradMain = main_.backward(gradSum);
  Tensor gradSkip = shortcut_.empty() ? gradSum : shortcut_.backward(gradSum);
  Tensor gradInput(gradMain.shape(), ops_);
  ops_.add(gradMain.data(), gradSkip.data(), gradInput.data(), gradInput.numel());
  return gradInput;
}

}  // namespace accordion
