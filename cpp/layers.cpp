#include "layers.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace accordion {

using dnnl::memory;
using tag = dnnl::memory::format_tag;

void initUniformFanIn(Tensor& t, int64_t fanIn, Random& rng) {
  const float bound = 1.0f / std::sqrt(static_cast<float>(fanIn));
  float* p = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = rng.uniform(-bound, bound);
}

static void requireActivation(const Tensor& x, int64_t channels, const char* layer) {
  if (x.rank() != 4 || (channels > 0 && x.dim(1) != channels))
    throw invalidArgument(std::string(layer) + " expects input (N, " + (channels > 0 ? std::to_string(channels) : "C") +
                          ", H, W), got " + shapeString(x.shape()));
}

// ---------------------------------------------------------------------------------------------
// Conv2d on oneDNN. Activations are given to oneDNN as NHWC; the weight layout is left to oneDNN
// (format "any") and the PyTorch-layout parameter is reordered into it once per pass.

struct Conv2d::Plan {
  Shape inputShape, outputShape;
  dnnl::convolution_forward::primitive_desc forwardDesc;
  dnnl::convolution_forward forward;
  dnnl::convolution_backward_data::primitive_desc backwardDataDesc;
  dnnl::convolution_backward_data backwardData;
  dnnl::convolution_backward_weights::primitive_desc backwardWeightsDesc;
  dnnl::convolution_backward_weights backwardWeights;
  CachedReorder weightForForward, weightForBackward, gradWeightOut;
};

Conv2d::Conv2d(int64_t inChannels, int64_t outChannels, int64_t kernel, int64_t stride, int64_t padding, bool bias, Random& rng)
    : inChannels_(inChannels), outChannels_(outChannels), kernel_(kernel), stride_(stride), padding_(padding), hasBias_(bias) {
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

Conv2d::~Conv2d() = default;

void Conv2d::collectState(const std::string& prefix, StateRefs& refs) {
  weight.name = prefix + "weight";
  refs.add(&weight);
  if (hasBias_) {
    bias.name = prefix + "bias";
    refs.add(&bias);
  }
}

Conv2d::Plan& Conv2d::planFor(const Shape& inputShape) {
  if (plan_ && plan_->inputShape == inputShape) return *plan_;
  const int64_t n = inputShape[0], h = inputShape[2], w = inputShape[3];
  const int64_t oh = (h + 2 * padding_ - kernel_) / stride_ + 1, ow = (w + 2 * padding_ - kernel_) / stride_ + 1;
  if (oh <= 0 || ow <= 0) throw invalidArgument("Conv2d input " + shapeString(inputShape) + " is smaller than the kernel");
  auto plan = std::make_unique<Plan>();
  plan->inputShape = inputShape;
  plan->outputShape = {n, outChannels_, oh, ow};
  const memory::desc src = activationDesc(inputShape), dst = activationDesc(plan->outputShape);
  const memory::desc weightsAny(dimsOf(weight.value.shape()), memory::data_type::f32, tag::any);
  const memory::desc biasDesc = hasBias_ ? plainDesc({outChannels_}, tag::x) : memory::desc();
  const memory::dims strides{stride_, stride_}, pad{padding_, padding_};
  const auto algo = dnnl::algorithm::convolution_direct;

  plan->forwardDesc = dnnl::convolution_forward::primitive_desc(
      dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src, weightsAny, biasDesc, dst, strides, pad, pad),
      cpuEngine());
  plan->forward = dnnl::convolution_forward(plan->forwardDesc);
  plan->backwardDataDesc = dnnl::convolution_backward_data::primitive_desc(
      dnnl::convolution_backward_data::desc(algo, src, weightsAny, dst, strides, pad, pad), cpuEngine(), plan->forwardDesc);
  plan->backwardData = dnnl::convolution_backward_data(plan->backwardDataDesc);
  plan->backwardWeightsDesc = dnnl::convolution_backward_weights::primitive_desc(
      dnnl::convolution_backward_weights::desc(algo, src, weightsAny, biasDesc, dst, strides, pad, pad), cpuEngine(),
      plan->forwardDesc);
  plan->backwardWeights = dnnl::convolution_backward_weights(plan->backwardWeightsDesc);
  plan_ = std::move(plan);
  return *plan_;
}

Tensor Conv2d::forward(const Tensor& input) {
  requireActivation(input, inChannels_, "Conv2d");
  Plan& plan = planFor(input.shape());
  input_ = input;
  ensureShape(output_, plan.outputShape);
  memory weights = plan.weightForForward(wrap(plainDesc(weight.value.shape(), tag::oihw), weight.value.data()),
                                         plan.forwardDesc.weights_desc());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(plan.forwardDesc.src_desc(), input.data())},
                                       {DNNL_ARG_WEIGHTS, weights},
                                       {DNNL_ARG_DST, wrap(plan.forwardDesc.dst_desc(), output_.data())}};
  if (hasBias_) args[DNNL_ARG_BIAS] = wrap(plainDesc({outChannels_}, tag::x), bias.value.data());
  plan.forward.execute(cpuStream(), args);
  return output_;
}

Tensor Conv2d::backward(const Tensor& gradOutput) {
  Plan& plan = *plan_;
  ensureShape(gradInput_, plan.inputShape);
  memory diffDst = wrap(activationDesc(plan.outputShape), gradOutput.data());

  memory weights = plan.weightForBackward(wrap(plainDesc(weight.value.shape(), tag::oihw), weight.value.data()),
                                          plan.backwardDataDesc.weights_desc());
  plan.backwardData.execute(cpuStream(), {{DNNL_ARG_DIFF_DST, diffDst},
                                          {DNNL_ARG_WEIGHTS, weights},
                                          {DNNL_ARG_DIFF_SRC, wrap(plan.backwardDataDesc.diff_src_desc(), gradInput_.data())}});

  memory userGradWeight = wrap(plainDesc(weight.grad.shape(), tag::oihw), weight.grad.data());
  const memory::desc gradWeightDesc = plan.backwardWeightsDesc.diff_weights_desc();
  memory gradWeight = gradWeightDesc == userGradWeight.get_desc() ? userGradWeight : memory(gradWeightDesc, cpuEngine());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(activationDesc(plan.inputShape), input_.data())},
                                       {DNNL_ARG_DIFF_DST, diffDst},
                                       {DNNL_ARG_DIFF_WEIGHTS, gradWeight}};
  if (hasBias_) args[DNNL_ARG_DIFF_BIAS] = wrap(plainDesc({outChannels_}, tag::x), bias.grad.data());
  plan.backwardWeights.execute(cpuStream(), args);
  if (gradWeight != userGradWeight) plan.gradWeightOut.into(gradWeight, userGradWeight);
  return gradInput_;
}

// ---------------------------------------------------------------------------------------------
// BatchNorm2d on oneDNN. oneDNN returns the batch mean and biased variance; the running variance
// uses the unbiased estimate, as PyTorch does.

struct BatchNorm2d::Plan {
  Shape inputShape;
  bool training;
  dnnl::batch_normalization_forward::primitive_desc forwardDesc;
  dnnl::batch_normalization_forward forward;
  dnnl::batch_normalization_backward::primitive_desc backwardDesc;
  dnnl::batch_normalization_backward backward;
};

BatchNorm2d::BatchNorm2d(int64_t channels, float momentum, float eps) : channels_(channels), momentum_(momentum), eps_(eps) {
  weight.value = Tensor({channels});
  weight.value.fill(1.0f);
  weight.grad = Tensor::zeros({channels});
  bias.value = Tensor::zeros({channels});
  bias.grad = Tensor::zeros({channels});
  runningMean.value = Tensor::zeros({channels});
  runningVar.value = Tensor({channels});
  runningVar.value.fill(1.0f);
  batchMean_ = Tensor({channels});
  batchVar_ = Tensor({channels});
}

BatchNorm2d::~BatchNorm2d() = default;

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

BatchNorm2d::Plan& BatchNorm2d::planFor(const Shape& inputShape, bool training) {
  if (plan_ && plan_->inputShape == inputShape && plan_->training == training) return *plan_;
  auto plan = std::make_unique<Plan>();
  plan->inputShape = inputShape;
  plan->training = training;
  const memory::desc data = activationDesc(inputShape);
  auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
  if (!training) flags = flags | dnnl::normalization_flags::use_global_stats;
  const auto kind = training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
  plan->forwardDesc = dnnl::batch_normalization_forward::primitive_desc(
      dnnl::batch_normalization_forward::desc(kind, data, eps_, flags), cpuEngine());
  plan->forward = dnnl::batch_normalization_forward(plan->forwardDesc);
  plan->backwardDesc = dnnl::batch_normalization_backward::primitive_desc(
      dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, data, data, eps_, flags), cpuEngine(),
      plan->forwardDesc);
  plan->backward = dnnl::batch_normalization_backward(plan->backwardDesc);
  plan_ = std::move(plan);
  return *plan_;
}

Tensor BatchNorm2d::forward(const Tensor& input) {
  requireActivation(input, channels_, "BatchNorm2d");
  Plan& plan = planFor(input.shape(), training_);
  input_ = input;
  forwardWasTraining_ = training_;
  ensureShape(output_, input.shape());
  const memory::desc data = activationDesc(input.shape()), channel = plainDesc({channels_}, tag::x);
  Tensor& mean = training_ ? batchMean_ : runningMean.value;
  Tensor& var = training_ ? batchVar_ : runningVar.value;
  plan.forward.execute(cpuStream(), {{DNNL_ARG_SRC, wrap(data, input.data())},
                                     {DNNL_ARG_DST, wrap(data, output_.data())},
                                     {DNNL_ARG_SCALE, wrap(channel, weight.value.data())},
                                     {DNNL_ARG_SHIFT, wrap(channel, bias.value.data())},
                                     {DNNL_ARG_MEAN, wrap(channel, mean.data())},
                                     {DNNL_ARG_VARIANCE, wrap(channel, var.data())}});
  if (training_) {
    const int64_t count = input.numel() / channels_;
    const float unbias = count > 1 ? static_cast<float>(count) / static_cast<float>(count - 1) : 1.0f;
    float* rm = runningMean.value.data();
    float* rv = runningVar.value.data();
    for (int64_t c = 0; c < channels_; ++c) {
      rm[c] = (1 - momentum_) * rm[c] + momentum_ * batchMean_.data()[c];
      rv[c] = (1 - momentum_) * rv[c] + momentum_ * batchVar_.data()[c] * unbias;
    }
    ++batchesTracked;
  }
  return output_;
}

Tensor BatchNorm2d::backward(const Tensor& gradOutput) {
  Plan& plan = planFor(input_.shape(), forwardWasTraining_);
  ensureShape(gradInput_, input_.shape());
  const memory::desc data = activationDesc(input_.shape()), channel = plainDesc({channels_}, tag::x);
  Tensor& mean = forwardWasTraining_ ? batchMean_ : runningMean.value;
  Tensor& var = forwardWasTraining_ ? batchVar_ : runningVar.value;
  plan.backward.execute(cpuStream(), {{DNNL_ARG_SRC, wrap(data, input_.data())},
                                      {DNNL_ARG_DIFF_DST, wrap(data, gradOutput.data())},
                                      {DNNL_ARG_MEAN, wrap(channel, mean.data())},
                                      {DNNL_ARG_VARIANCE, wrap(channel, var.data())},
                                      {DNNL_ARG_SCALE, wrap(channel, weight.value.data())},
                                      {DNNL_ARG_SHIFT, wrap(channel, bias.value.data())},
                                      {DNNL_ARG_DIFF_SRC, wrap(data, gradInput_.data())},
                                      {DNNL_ARG_DIFF_SCALE, wrap(channel, weight.grad.data())},
                                      {DNNL_ARG_DIFF_SHIFT, wrap(channel, bias.grad.data())}});
  return gradInput_;
}

// ---------------------------------------------------------------------------------------------

Tensor ReLU::forward(const Tensor& input) {
  const int64_t n = input.numel();
  if (inPlace_) {
    output_ = input;
  } else {
    ensureShape(output_, input.shape());
  }
  const float* x = input.data();
  float* y = output_.data();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  return output_;
}

Tensor ReLU::backward(const Tensor& gradOutput) {
  const int64_t n = output_.numel();
  ensureShape(gradInput_, output_.shape());
  const float* y = output_.data();
  const float* dy = gradOutput.data();
  float* dx = gradInput_.data();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
  return gradInput_;
}

// ---------------------------------------------------------------------------------------------

struct MaxPool2d::Plan {
  Shape inputShape, outputShape;
  dnnl::pooling_forward::primitive_desc forwardDesc;
  dnnl::pooling_forward forward;
  dnnl::pooling_backward::primitive_desc backwardDesc;
  dnnl::pooling_backward backward;
  memory workspace;
};

MaxPool2d::MaxPool2d(int64_t kernel, int64_t stride, int64_t padding) : kernel_(kernel), stride_(stride), padding_(padding) {}
MaxPool2d::~MaxPool2d() = default;

MaxPool2d::Plan& MaxPool2d::planFor(const Shape& inputShape) {
  if (plan_ && plan_->inputShape == inputShape) return *plan_;
  const int64_t oh = (inputShape[2] + 2 * padding_ - kernel_) / stride_ + 1;
  const int64_t ow = (inputShape[3] + 2 * padding_ - kernel_) / stride_ + 1;
  if (oh <= 0 || ow <= 0) throw invalidArgument("MaxPool2d input " + shapeString(inputShape) + " is smaller than the window");
  auto plan = std::make_unique<Plan>();
  plan->inputShape = inputShape;
  plan->outputShape = {inputShape[0], inputShape[1], oh, ow};
  const memory::desc src = activationDesc(inputShape), dst = activationDesc(plan->outputShape);
  const memory::dims strides{stride_, stride_}, kernel{kernel_, kernel_}, pad{padding_, padding_};
  plan->forwardDesc = dnnl::pooling_forward::primitive_desc(
      dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, src, dst, strides, kernel,
                                  pad, pad),
      cpuEngine());
  plan->forward = dnnl::pooling_forward(plan->forwardDesc);
  plan->backwardDesc = dnnl::pooling_backward::primitive_desc(
      dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, src, dst, strides, kernel, pad, pad), cpuEngine(),
      plan->forwardDesc);
  plan->backward = dnnl::pooling_backward(plan->backwardDesc);
  plan->workspace = memory(plan->forwardDesc.workspace_desc(), cpuEngine());
  plan_ = std::move(plan);
  return *plan_;
}

Tensor MaxPool2d::forward(const Tensor& input) {
  requireActivation(input, 0, "MaxPool2d");
  Plan& plan = planFor(input.shape());
  ensureShape(output_, plan.outputShape);
  plan.forward.execute(cpuStream(), {{DNNL_ARG_SRC, wrap(activationDesc(plan.inputShape), input.data())},
                                     {DNNL_ARG_DST, wrap(activationDesc(plan.outputShape), output_.data())},
                                     {DNNL_ARG_WORKSPACE, plan.workspace}});
  return output_;
}

Tensor MaxPool2d::backward(const Tensor& gradOutput) {
  Plan& plan = *plan_;
  ensureShape(gradInput_, plan.inputShape);
  plan.backward.execute(cpuStream(), {{DNNL_ARG_DIFF_DST, wrap(activationDesc(plan.outputShape), gradOutput.data())},
                                      {DNNL_ARG_DIFF_SRC, wrap(activationDesc(plan.inputShape), gradInput_.data())},
                                      {DNNL_ARG_WORKSPACE, plan.workspace}});
  return gradInput_;
}

// ---------------------------------------------------------------------------------------------

Tensor GlobalAvgPool::forward(const Tensor& input) {
  requireActivation(input, 0, "GlobalAvgPool");
  inputShape_ = input.shape();
  const int64_t n = input.dim(0), c = input.dim(1), hw = input.dim(2) * input.dim(3);
  ensureShape(output_, {n, c});
  const float scale = 1.0f / static_cast<float>(hw);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; ++b) {
    float* out = output_.data() + b * c;
    const float* x = input.data() + b * hw * c;
    std::fill(out, out + c, 0.0f);
    for (int64_t p = 0; p < hw; ++p)
      for (int64_t ch = 0; ch < c; ++ch) out[ch] += x[p * c + ch];
    for (int64_t ch = 0; ch < c; ++ch) out[ch] *= scale;
  }
  return output_;
}

Tensor GlobalAvgPool::backward(const Tensor& gradOutput) {
  const int64_t n = inputShape_[0], c = inputShape_[1], hw = inputShape_[2] * inputShape_[3];
  ensureShape(gradInput_, inputShape_);
  const float scale = 1.0f / static_cast<float>(hw);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; ++b) {
    const float* dy = gradOutput.data() + b * c;
    float* dx = gradInput_.data() + b * hw * c;
    for (int64_t p = 0; p < hw; ++p)
      for (int64_t ch = 0; ch < c; ++ch) dx[p * c + ch] = dy[ch] * scale;
  }
  return gradInput_;
}

// ---------------------------------------------------------------------------------------------

Tensor Flatten::forward(const Tensor& input) {
  requireActivation(input, 0, "Flatten");
  inputShape_ = input.shape();
  const int64_t n = input.dim(0), c = input.dim(1), h = input.dim(2), w = input.dim(3);
  if (h * w == 1) return input.reshaped({n, c});
  ensureShape(output_, {n, c * h * w});
  nhwcToNchw(input.data(), output_.data(), n, c, h, w);
  return output_;
}

Tensor Flatten::backward(const Tensor& gradOutput) {
  const int64_t n = inputShape_[0], c = inputShape_[1], h = inputShape_[2], w = inputShape_[3];
  if (h * w == 1) return gradOutput.reshaped(inputShape_);
  ensureShape(gradInput_, inputShape_);
  nchwToNhwc(gradOutput.data(), gradInput_.data(), n, c, h, w);
  return gradInput_;
}

// ---------------------------------------------------------------------------------------------
// Linear on OpenBLAS: y = x·Wᵀ + b, dW = dyᵀ·x, dx = dy·W, db = Σ_rows dy.

Linear::Linear(int64_t inFeatures, int64_t outFeatures, Random& rng) : in_(inFeatures), out_(outFeatures) {
  weight.value = Tensor({outFeatures, inFeatures});
  weight.grad = Tensor::zeros({outFeatures, inFeatures});
  bias.value = Tensor({outFeatures});
  bias.grad = Tensor::zeros({outFeatures});
  initUniformFanIn(weight.value, inFeatures, rng);
  initUniformFanIn(bias.value, inFeatures, rng);
}

void Linear::collectState(const std::string& prefix, StateRefs& refs) {
  weight.name = prefix + "weight";
  bias.name = prefix + "bias";
  refs.add(&weight);
  refs.add(&bias);
}

Tensor Linear::forward(const Tensor& input) {
  if (input.rank() != 2 || input.dim(1) != in_)
    throw invalidArgument("Linear expects input (N, " + std::to_string(in_) + "), got " + shapeString(input.shape()));
  const int64_t n = input.dim(0);
  input_ = input;
  ensureShape(output_, {n, out_});
  float* y = output_.data();
  for (int64_t r = 0; r < n; ++r) std::copy(bias.value.data(), bias.value.data() + out_, y + r * out_);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out_, in_, 1.0f, input.data(), in_, weight.value.data(), in_, 1.0f, y,
              out_);
  return output_;
}

Tensor Linear::backward(const Tensor& gradOutput) {
  const int64_t n = input_.dim(0);
  ensureShape(gradInput_, {n, in_});
  const float* dy = gradOutput.data();
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out_, in_, n, 1.0f, dy, out_, input_.data(), in_, 0.0f,
              weight.grad.data(), in_);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in_, out_, 1.0f, dy, out_, weight.value.data(), in_, 0.0f,
              gradInput_.data(), in_);
  float* db = bias.grad.data();
  std::fill(db, db + out_, 0.0f);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < out_; ++j) db[j] += dy[r * out_ + j];
  return gradInput_;
}

// ---------------------------------------------------------------------------------------------

Tensor Dropout::forward(const Tensor& input) {
  if (!training_ || p_ == 0.0f) return input;
  const int64_t n = input.numel();
  ensureShape(output_, input.shape());
  keep_.resize(n);
  const float scale = 1.0f / (1.0f - p_);
  const float* x = input.data();
  float* y = output_.data();
  for (int64_t i = 0; i < n; ++i) {
    keep_[i] = rng_.uniform() >= p_;
    y[i] = keep_[i] ? x[i] * scale : 0.0f;
  }
  return output_;
}

Tensor Dropout::backward(const Tensor& gradOutput) {
  if (!training_ || p_ == 0.0f) return gradOutput;
  ensureShape(gradInput_, gradOutput.shape());
  const float scale = 1.0f / (1.0f - p_);
  const float* dy = gradOutput.data();
  float* dx = gradInput_.data();
  for (int64_t i = 0; i < gradOutput.numel(); ++i) dx[i] = keep_[i] ? dy[i] * scale : 0.0f;
  return gradInput_;
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
  for (auto it = children_.rbegin(); it != children_.rend(); ++it) g = it->second->backward(g);
  return g;
}

void Sequential::collectState(const std::string& prefix, StateRefs& refs) {
  for (auto& [name, child] : children_) child->collectState(prefix + name + ".", refs);
}

void Sequential::setTraining(bool training) {
  training_ = training;
  for (auto& [name, child] : children_) child->setTraining(training);
}

void Sequential::freezeBatchNorm(bool frozen) {
  for (auto& [name, child] : children_) child->freezeBatchNorm(frozen);
}

// ---------------------------------------------------------------------------------------------

BasicBlock::BasicBlock(int64_t inPlanes, int64_t planes, int64_t stride, Random& rng) {
  main_.add("conv1", std::make_unique<Conv2d>(inPlanes, planes, 3, stride, 1, false, rng))
      .add("bn1", std::make_unique<BatchNorm2d>(planes))
      .add("relu", std::make_unique<ReLU>(true))
      .add("conv2", std::make_unique<Conv2d>(planes, planes, 3, 1, 1, false, rng))
      .add("bn2", std::make_unique<BatchNorm2d>(planes));
  if (stride != 1 || inPlanes != planes) {
    shortcut_.add("0", std::make_unique<Conv2d>(inPlanes, planes, 1, stride, 0, false, rng))
        .add("1", std::make_unique<BatchNorm2d>(planes));
  }
}

void BasicBlock::collectState(const std::string& prefix, StateRefs& refs) {
  main_.collectState(prefix, refs);  // conv1, bn1, conv2, bn2 directly under the block's prefix
  shortcut_.collectState(prefix + "shortcut.", refs);
}

void BasicBlock::setTraining(bool training) {
  training_ = training;
  main_.setTraining(training);
  shortcut_.setTraining(training);
}

void BasicBlock::freezeBatchNorm(bool frozen) {
  main_.freezeBatchNorm(frozen);
  shortcut_.freezeBatchNorm(frozen);
}

Tensor BasicBlock::forward(const Tensor& input) {
  Tensor sum = main_.forward(input);  // bn2's output buffer, which bn2's backward does not need
  Tensor skip = shortcut_.empty() ? input : shortcut_.forward(input);
  float* s = sum.data();
  const float* k = skip.data();
  const int64_t n = sum.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) s[i] += k[i];
  return outRelu_.forward(sum);
}

Tensor BasicBlock::backward(const Tensor& gradOutput) {
  Tensor gradSum = outRelu_.backward(gradOutput);
  Tensor gradMain = main_.backward(gradSum);
  Tensor gradSkip = shortcut_.empty() ? gradSum : shortcut_.backward(gradSum);
  ensureShape(gradInput_, gradMain.shape());
  const float* a = gradMain.data();
  const float* b = gradSkip.data();
  float* d = gradInput_.data();
  const int64_t n = gradInput_.numel();
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] = a[i] + b[i];
  return gradInput_;
}

// ---------------------------------------------------------------------------------------------

double softmaxCrossEntropy(const Tensor& logits, const int32_t* labels, Tensor& gradLogits, int64_t* correct) {
  if (logits.rank() != 2) throw invalidArgument("cross-entropy expects logits (N, classes), got " + shapeString(logits.shape()));
  const int64_t n = logits.dim(0), k = logits.dim(1);
  for (int64_t r = 0; r < n; ++r)
    if (labels[r] < 0 || labels[r] >= k)
      throw invalidArgument("label " + std::to_string(labels[r]) + " of sample " + std::to_string(r) + " is outside 0.." +
                            std::to_string(k - 1));
  ensureShape(gradLogits, logits.shape());
  double total = 0;
  int64_t hits = 0;
  const float invN = 1.0f / static_cast<float>(n);
  // Rows are independent; each row's sums run in float over the classes (language models have tens
  // of thousands), its log-sum in double.
#pragma omp parallel for reduction(+ : total, hits) schedule(static) if (n * k > 65536)
  for (int64_t r = 0; r < n; ++r) {
    const float* z = logits.data() + r * k;
    float* g = gradLogits.data() + r * k;
    const int32_t label = labels[r];
    int64_t best = 0;
    float maxZ = z[0];
    for (int64_t j = 1; j < k; ++j)
      if (z[j] > maxZ) maxZ = z[j], best = j;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < k; ++j) {
      g[j] = std::exp(z[j] - maxZ);
      sum += g[j];
    }
    const double logSum = std::log(static_cast<double>(sum));
    total += logSum - static_cast<double>(z[label] - maxZ);
    const float scale = invN / sum;
#pragma omp simd
    for (int64_t j = 0; j < k; ++j) g[j] *= scale;
    g[label] -= invN;
    hits += best == label;
  }
  if (correct) *correct = hits;
  return total / static_cast<double>(n);
}

void nchwToNhwc(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t hw = h * w;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) dst[(b * hw + p) * c + ch] = src[(b * c + ch) * hw + p];
}

void nhwcToNchw(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t hw = h * w;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) dst[(b * c + ch) * hw + p] = src[(b * hw + p) * c + ch];
}

}  // namespace accordion
