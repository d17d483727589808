// JS class LayerProbe: one layer, driven synchronously on small inputs (gradient checks, inspection).
// Inputs and outputs use PyTorch's NCHW layout; conversions to the engine's layout happen here.
#include <algorithm>

#include "napi/classes.h"

namespace accordion::napi {

Napi::Function LayerProbeWrap::define(Napi::Env env) {
  return DefineClass(env, "LayerProbe",
                     {method<&LayerProbeWrap::forward>("forward"), method<&LayerProbeWrap::backward>("backward"),
                      method<&LayerProbeWrap::state>("state"), method<&LayerProbeWrap::setValue>("setValue")});
}

// A probe is for small shapes: every size option, and every tensor it builds, is bounded, so that
// no argument reaches the layer's arithmetic (or its allocations) unchecked.
constexpr int64_t kMaxWidth = 1 << 16;           // channels, features, planes
constexpr int64_t kMaxWindow = 1 << 10;          // kernel, stride, padding
constexpr int64_t kMaxTensor = int64_t{1} << 26;  // elements of any input, output or weight (256 MiB)

// new LayerProbe(kind, options): kinds conv2d, batchnorm2d, relu, maxpool2d, globalavgpool, flatten,
// linear, dropout, basicblock; `precision` 'bf16' computes its convolutions and products in bf16.
LayerProbeWrap::LayerProbeWrap(const Napi::CallbackInfo& info) try : GuardedWrap<LayerProbeWrap>(info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) throw typeError(env, "layer kind must be a string");
  kind_ = info[0].As<Napi::String>().Utf8Value();
  if (!info[1].IsUndefined() && !info[1].IsObject()) throw typeError(env, "layer options must be an object");
  Napi::Object o = info[1].IsObject() ? info[1].As<Napi::Object>() : Napi::Object::New(env);
  auto width = [&](const char* key) { return intOption(o, key, 1, 1, kMaxWidth); };
  auto window = [&](const char* key, int64_t fallback, int64_t min) { return intOption(o, key, fallback, min, kMaxWindow); };
  auto weights = [&](const Shape& shape) { elementCount(env, shape, kind_ + " weight", kMaxTensor); };
  const uint64_t seed = static_cast<uint64_t>(intOption(o, "seed", 0, 0, kMaxSafeInteger));
  Random rng(seed);
  backend_ = std::make_unique<CpuBackend>();
  const std::string precision = stringOption(o, "precision", "fp32");
  if (precision != "fp32" && precision != "bf16") throw rangeError(env, "option 'precision' must be 'fp32' or 'bf16', got '" + precision + "'");
  backend_->options.compute = parsePrecision(precision);
  Backend& ops = *backend_;
  if (kind_ == "conv2d") {
    const int64_t in = width("inChannels"), out = width("outChannels"), kernel = window("kernel", 3, 1);
    const int64_t stride = window("stride", 1, 1), padding = window("padding", 0, 0);
    weights({out, in, kernel, kernel});
    layer_ = std::make_unique<Conv2d>(ops, in, out, kernel, stride, padding, boolOption(o, "bias", true), rng);
    window_ = {kernel, stride, padding};
    outChannels_ = out;
  } else if (kind_ == "batchnorm2d") {
    layer_ = std::make_unique<BatchNorm2d>(ops, width("channels"), boolOption(o, "relu", false) ? Activation::Relu : Activation::None);
  } else if (kind_ == "relu") {
    layer_ = std::make_unique<ReLU>(ops, false);
  } else if (kind_ == "maxpool2d") {
    window_ = {window("kernel", 2, 1), window("stride", 2, 1), window("padding", 0, 0)};
    layer_ = std::make_unique<MaxPool2d>(ops, window_[0], window_[1], window_[2]);
  } else if (kind_ == "globalavgpool") {
    layer_ = std::make_unique<ImagesToRows>(ops, ImagesToRows::kAverage);
  } else if (kind_ == "flatten") {
    layer_ = std::make_unique<ImagesToRows>(ops, ImagesToRows::kFlatten);
  } else if (kind_ == "linear") {
    const int64_t in = width("inFeatures"), out = width("outFeatures");
    weights({out, in});
    layer_ = std::make_unique<Linear>(ops, in, out, rng);
    outChannels_ = out;
  } else if (kind_ == "dropout") {
    const double p = numberOption(o, "p", 0.5);
    if (!(p >= 0 && p < 1)) throw rangeError(env, "option 'p' must lie in [0, 1), got " + numberText(p));
    layer_ = std::make_unique<Dropout>(ops, static_cast<float>(p), seed);
  } else if (kind_ == "basicblock") {
    const int64_t in = width("inPlanes"), planes = width("planes"), stride = window("stride", 1, 1);
    weights({planes, std::max(in, planes), 3, 3});
    layer_ = std::make_unique<BasicBlock>(ops, in, planes, stride, rng);
    window_ = {3, stride, 1};
    outChannels_ = planes;
  } else {
    throw invalidArgument("unknown layer kind '" + kind_ +
                          "' (known: conv2d, batchnorm2d, relu, maxpool2d, globalavgpool, flatten, linear, dropout, basicblock)");
  }
  layer_->collectState("", refs_);
} catch (...) {
  rethrowAsJs(info.Env());
}

// The number of elements the layer's output will have for `input`, at most: checked against the
// probe's bound before the layer allocates it. Shapes the layer itself refuses pass through here.
int64_t LayerProbeWrap::outputBound(Napi::Env env, const Shape& input) const {
  if (input.size() != 4 || window_.empty()) {
    if (kind_ == "linear" && input.size() == 2) return elementCount(env, {input[0], outChannels_}, "linear output", kMaxTensor);
    return elementCount(env, input, "input", kMaxTensor);
  }
  const int64_t kernel = window_[0], stride = window_[1], padding = window_[2];
  auto side = [&](int64_t size) { return size + 2 * padding < kernel ? 1 : (size + 2 * padding - kernel) / stride + 1; };
  const int64_t channels = outChannels_ ? outChannels_ : input[1];
  return elementCount(env, {input[0], channels, side(input[2]), side(input[3])}, kind_ + " output", kMaxTensor);
}

// forward(x: Float32Array, shape, training = true) → { data: Float32Array, shape }
Napi::Value LayerProbeWrap::forward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array data = float32Arg(info, 0, "input");
  const Shape shape = shapeArg(env, info[1], "shape");
  if (shape.empty()) throw rangeError(env, "shape must have at least one dimension");
  for (int64_t d : shape)
    if (d < 1) throw rangeError(env, "shape " + shapeString(shape) + " has a dimension below 1");
  elementCount(env, shape, "input", kMaxTensor);
  outputBound(env, shape);
  Tensor x = fromJs(data, shape, env);
  layer_->setTraining(info.Length() < 3 || info[2].ToBoolean().Value());
  Tensor y = layer_->forward(x);
  outputShape_ = y.shape();
  Napi::Object out = Napi::Object::New(env);
  out.Set("data", toJs(env, y));
  out.Set("shape", shapeValue(env, y.shape()));
  return out;
}

// backward(dy: Float32Array shaped like the last output) → Float32Array dL/dx
Napi::Value LayerProbeWrap::backward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (outputShape_.empty()) throw makeError(env, "ERR_INVALID_STATE", "backward called before forward");
  Tensor dy = fromJs(float32Arg(info, 0, "gradOutput"), outputShape_, env);
  return toJs(env, layer_->backward(dy));
}

// state() → [{ name, kind: 'parameter' | 'buffer', shape, value, grad? }] (copies)
Napi::Value LayerProbeWrap::state(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Array out = Napi::Array::New(env);
  uint32_t i = 0;
  for (Parameter* p : refs_.parameters) {
    Napi::Object e = Napi::Object::New(env);
    e.Set("name", p->name);
    e.Set("kind", "parameter");
    e.Set("shape", shapeValue(env, p->value.shape()));
    e.Set("value", toJs(env, p->value, false));
    e.Set("grad", toJs(env, p->grad, false));
    out.Set(i++, e);
  }
  for (Buffer* b : refs_.buffers) {
    Napi::Object e = Napi::Object::New(env);
    e.Set("name", b->name);
    e.Set("kind", "buffer");
    e.Set("shape", shapeValue(env, b->value.shape()));
    e.Set("value", toJs(env, b->value, false));
    out.Set(i++, e);
  }
  return out;
}

// setValue(name, data: Float32Array) replaces a parameter's or buffer's value.
Napi::Value LayerProbeWrap::setValue(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsString()) throw typeError(env, "name must be a string");
  const std::string name = info[0].As<Napi::String>().Utf8Value();
  Napi::Float32Array data = float32Arg(info, 1, "value");
  Tensor* target = nullptr;
  for (Parameter* p : refs_.parameters)
    if (p->name == name) target = &p->value;
  for (Buffer* b : refs_.buffers)
    if (b->name == name) target = &b->value;
  if (!target) throw makeError(env, "ERR_INVALID_ARGUMENT", "the layer has no parameter or buffer '" + name + "'");
  target->copyFrom(fromJs(data, target->shape(), env, false));
  return env.Undefined();
}

}  // namespace accordion::napi
