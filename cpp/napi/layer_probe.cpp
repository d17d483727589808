// JS class LayerProbe: one layer, driven synchronously on small inputs (gradient checks, inspection).
// Inputs and outputs use PyTorch's NCHW layout; conversions to the engine's layout happen here.
#include "napi/classes.h"

namespace accordion::napi {

Napi::Function LayerProbeWrap::define(Napi::Env env) {
  return DefineClass(env, "LayerProbe",
                     {InstanceMethod("forward", &LayerProbeWrap::forward), InstanceMethod("backward", &LayerProbeWrap::backward),
                      InstanceMethod("state", &LayerProbeWrap::state), InstanceMethod("setValue", &LayerProbeWrap::setValue)});
}

// new LayerProbe(kind, options): kinds conv2d, batchnorm2d, relu, maxpool2d, globalavgpool, flatten,
// linear, dropout, basicblock.
LayerProbeWrap::LayerProbeWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<LayerProbeWrap>(info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) throw typeError(env, "layer kind must be a string");
  const std::string kind = info[0].As<Napi::String>().Utf8Value();
  Napi::Object o = info.Length() > 1 && info[1].IsObject() ? info[1].As<Napi::Object>() : Napi::Object::New(env);
  auto n = [&](const char* key, double fallback) { return static_cast<int64_t>(numberOption(o, key, fallback)); };
  Random rng(static_cast<uint64_t>(numberOption(o, "seed", 0)));
  backend_ = std::make_unique<CpuBackend>();
  Backend& ops = *backend_;
  try {
    if (kind == "conv2d")
      layer_ = std::make_unique<Conv2d>(ops, n("inChannels", 1), n("outChannels", 1), n("kernel", 3), n("stride", 1), n("padding", 0),
                                        boolOption(o, "bias", true), rng);
    else if (kind == "batchnorm2d")
      layer_ = std::make_unique<BatchNorm2d>(ops, n("channels", 1));
    else if (kind == "relu")
      layer_ = std::make_unique<ReLU>(ops, false);
    else if (kind == "maxpool2d")
      layer_ = std::make_unique<MaxPool2d>(ops, n("kernel", 2), n("stride", 2), n("padding", 0));
    else if (kind == "globalavgpool")
      layer_ = std::make_unique<GlobalAvgPool>(ops);
    else if (kind == "flatten")
      layer_ = std::make_unique<Flatten>(ops);
    else if (kind == "linear")
      layer_ = std::make_unique<Linear>(ops, n("inFeatures", 1), n("outFeatures", 1), rng);
    else if (kind == "dropout")
      layer_ = std::make_unique<Dropout>(ops, static_cast<float>(numberOption(o, "p", 0.5)), static_cast<uint64_t>(n("seed", 0)));
    else if (kind == "basicblock")
      layer_ = std::make_unique<BasicBlock>(ops, n("inPlanes", 1), n("planes", 1), n("stride", 1), rng);
    else
      throw invalidArgument("unknown layer kind '" + kind + "'");
  } catch (const EngineError& e) {
    throw makeError(env, e.code(), e.what());
  }
  layer_->collectState("", refs_);
}

// forward(x: Float32Array, shape, training = true) → { data: Float32Array, shape }
Napi::Value LayerProbeWrap::forward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Tensor x = fromJs(float32Arg(info, 0, "input"), shapeArg(env, info[1], "shape"), env);
  layer_->setTraining(info.Length() < 3 || info[2].ToBoolean().Value());
  try {
    Tensor y = layer_->forward(x);
    outputShape_ = y.shape();
    Napi::Object out = Napi::Object::New(env);
    out.Set("data", toJs(env, y));
    out.Set("shape", shapeValue(env, y.shape()));
    return out;
  } catch (const EngineError& e) {
    throw makeError(env, e.code(), e.what());
  }
}

// backward(dy: Float32Array shaped like the last output) → Float32Array dL/dx
Napi::Value LayerProbeWrap::backward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (outputShape_.empty()) throw makeError(env, "ERR_INVALID_STATE", "backward called before forward");
  Tensor dy = fromJs(float32Arg(info, 0, "gradOutput"), outputShape_, env);
  try {
    return toJs(env, layer_->backward(dy));
  } catch (const EngineError& e) {
    throw makeError(env, e.code(), e.what());
  }
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
  const std::string name = info[0].ToString().Utf8Value();
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
