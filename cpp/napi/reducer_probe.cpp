// JS class ReducerProbe: W in-process workers compressing and exchanging given gradients.
#include <thread>

#include "comm/staged_group.h"
#include "napi/classes.h"

namespace accordion::napi {

Napi::Function ReducerProbeWrap::define(Napi::Env env) {
  return DefineClass(env, "ReducerProbe",
                     {InstanceMethod("step", &ReducerProbeWrap::step), InstanceMethod("memory", &ReducerProbeWrap::memory),
                      InstanceMethod("q", &ReducerProbeWrap::q), InstanceMethod("setQ", &ReducerProbeWrap::setQ),
                      InstanceMethod("level", &ReducerProbeWrap::level), InstanceMethod("setLevel", &ReducerProbeWrap::setLevel),
                      InstanceMethod("isCompressed", &ReducerProbeWrap::isCompressed),
                      InstanceMethod("floatsPerStep", &ReducerProbeWrap::floatsPerStep),
                      InstanceMethod("norms", &ReducerProbeWrap::norms),
                      InstanceMethod("randomize", &ReducerProbeWrap::randomize),
                      InstanceMethod("setInput", &ReducerProbeWrap::setInput), InstanceMethod("restart", &ReducerProbeWrap::restart),
                      InstanceMethod("run", &ReducerProbeWrap::run)});
}

// A tensor of `backend` as a flat Float32Array.
static Napi::Value flat(Napi::Env env, Backend& backend, const Tensor& t) {
  return toJs(env, backend.toHost(t).reshaped({t.numel()}));
}

static Napi::Value guarded(Napi::Env env, const std::function<Napi::Value()>& body) {
  try {
    return body();
  } catch (const EngineError& e) {
    throw makeError(env, e.code(), e.what());
  }
}

// new ReducerProbe(shapes: number[][], { compressor, level, workers, seed, minCompressionRate, accumulateNorms, group, device })
// With `group` (a connected ProcessGroup) the probe is this process's single worker of a real job.
// On a GPU (`device` 'cuda' or 'cuda:N') each worker has its own backend there, and the collectives
// stage through host memory.
ReducerProbeWrap::ReducerProbeWrap(const Napi::CallbackInfo& info) : Napi::ObjectWrap<ReducerProbeWrap>(info) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray() || !info[1].IsObject()) throw typeError(env, "expected (shapes, options)");
  Napi::Array shapes = info[0].As<Napi::Array>();
  Napi::Object o = info[1].As<Napi::Object>();
  Napi::Value groupValue = o.Get("group");
  if (!groupValue.IsUndefined()) {
    if (!isProcessGroup(groupValue)) throw typeError(env, "option 'group' must be a ProcessGroup");
    auto* wrap = ProcessGroupWrap::Unwrap(groupValue.As<Napi::Object>());
    processGroup_ = wrap->group();
    if (!processGroup_) throw makeError(env, "ERR_NOT_READY", "the process group is not connected");
  }
  const int workers = processGroup_ ? 1 : static_cast<int>(numberOption(o, "workers", 1));
  if (workers < 1) throw typeError(env, "workers must be ≥ 1");
  guarded(env, [&]() -> Napi::Value {
    ReducerOptions options;
    options.compressor = parseCompressor(stringOption(o, "compressor", "none"));
    options.level = numberOption(o, "level", options.compressor == Compressor::TopK ? 0.1 : 1);
    options.seed = static_cast<uint64_t>(numberOption(o, "seed", 42));
    options.minCompressionRate = numberOption(o, "minCompressionRate", 1.0);
    options.accumulateNorms = boolOption(o, "accumulateNorms", false);
    const Device device = parseDevice(stringOption(o, "device", "cpu"));
    group_ = std::make_unique<InProcessGroup>(workers);
    parameters_.resize(workers);
    for (int w = 0; w < workers; ++w) {
      backends_.push_back(makeBackend(device));  // one per worker thread
      Backend& backend = *backends_[w];
      for (uint32_t i = 0; i < shapes.Length(); ++i) {
        Shape shape = shapeArg(env, shapes.Get(i), "shape");
        parameters_[w].push_back(Parameter{"p" + std::to_string(i), backend.zeros(shape), backend.zeros(shape)});
      }
      std::vector<Parameter*> pointers;
      for (auto& p : parameters_[w]) pointers.push_back(&p);
      ProcessGroup* group = processGroup_ ? processGroup_.get() : &group_->member(w);
      if (device.isCuda()) {
        staged_.push_back(std::make_unique<StagedGroup>(*group, backend));
        group = staged_.back().get();
      }
      reducers_.push_back(std::make_unique<GradientReducer>(pointers, options, *group, backend));
    }
    return env.Undefined();
  });
}

GradientReducer& ReducerProbeWrap::reducer(const Napi::CallbackInfo& info, size_t workerArg) {
  const int64_t w = info[workerArg].As<Napi::Number>().Int64Value();
  if (w < 0 || w >= static_cast<int64_t>(reducers_.size())) throw typeError(info.Env(), "no worker " + std::to_string(w));
  return *reducers_[w];
}

size_t ReducerProbeWrap::parameterArg(const Napi::CallbackInfo& info, size_t index) {
  const int64_t p = info[index].As<Napi::Number>().Int64Value();
  if (p < 0 || p >= static_cast<int64_t>(parameters_[0].size())) throw typeError(info.Env(), "no parameter " + std::to_string(p));
  return static_cast<size_t>(p);
}

// step(grads: Float32Array[][] indexed [worker][parameter]) → { outputs: Float32Array[][], floatsSent }
Napi::Value ReducerProbeWrap::step(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Array grads = info[0].As<Napi::Array>();
  const size_t workers = reducers_.size();
  if (!info[0].IsArray() || grads.Length() != workers) throw typeError(env, "grads must hold one array per worker");
  for (size_t w = 0; w < workers; ++w) {
    Napi::Array list = grads.Get(static_cast<uint32_t>(w)).As<Napi::Array>();
    for (size_t i = 0; i < parameters_[w].size(); ++i) {
      Tensor& g = parameters_[w][i].grad;
      Napi::Float32Array a = list.Get(static_cast<uint32_t>(i)).As<Napi::Float32Array>();
      if (static_cast<int64_t>(a.ElementLength()) != g.numel()) throw typeError(env, "gradient " + std::to_string(i) + " has the wrong size");
      backends_[w]->upload(g.data(), a.Data(), g.bytes());
    }
  }
  std::vector<ReduceResult> results(workers);
  std::vector<std::string> errors(workers), codes(workers);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      try {
        results[w] = reducers_[w]->reduce();
      } catch (const EngineError& e) {
        codes[w] = e.code();
        errors[w] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (size_t w = 0; w < workers; ++w)
    if (!errors[w].empty()) throw makeError(env, codes[w], errors[w]);
  Napi::Object out = Napi::Object::New(env);
  Napi::Array outputs = Napi::Array::New(env, workers);
  for (size_t w = 0; w < workers; ++w) {
    Napi::Array list = Napi::Array::New(env, parameters_[w].size());
    for (size_t i = 0; i < parameters_[w].size(); ++i) list.Set(static_cast<uint32_t>(i), flat(env, *backends_[w], parameters_[w][i].grad));
    outputs.Set(static_cast<uint32_t>(w), list);
  }
  out.Set("outputs", outputs);
  out.Set("floatsSent", static_cast<double>(results[0].floatsSent));
  return out;
}

// memory(worker, parameter) → Float32Array | null (flat, PyTorch layout)
Napi::Value ReducerProbeWrap::memory(const Napi::CallbackInfo& info) {
  const Tensor& t = reducer(info, 0).errorMemory(parameterArg(info, 1));
  return t.defined() ? flat(info.Env(), *backends_.at(info[0].As<Napi::Number>().Uint32Value()), t) : info.Env().Null();
}

// q(worker, parameter) → Float32Array | null, row-major (cols, r)
Napi::Value ReducerProbeWrap::q(const Napi::CallbackInfo& info) {
  const Tensor& t = reducer(info, 0).powerSgdQ(parameterArg(info, 1));
  return t.defined() ? flat(info.Env(), *backends_.at(info[0].As<Napi::Number>().Uint32Value()), t) : info.Env().Null();
}

// setQ(parameter, Float32Array) on every worker
Napi::Value ReducerProbeWrap::setQ(const Napi::CallbackInfo& info) {
  const size_t p = parameterArg(info, 0);
  Napi::Float32Array a = float32Arg(info, 1, "q");
  for (size_t w = 0; w < reducers_.size(); ++w) {
    Tensor& q = reducers_[w]->powerSgdQ(p);
    if (!q.defined() || q.numel() != static_cast<int64_t>(a.ElementLength()))
      throw typeError(info.Env(), "q must hold " + std::to_string(q.numel()) + " floats");
    backends_[w]->upload(q.data(), a.Data(), q.bytes());
  }
  return info.Env().Undefined();
}

Napi::Value ReducerProbeWrap::level(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), reducers_[0]->level(parameterArg(info, 0)));
}

// setLevel(parameter, level) on every worker
Napi::Value ReducerProbeWrap::setLevel(const Napi::CallbackInfo& info) {
  const size_t p = parameterArg(info, 0);
  const double level = info[1].As<Napi::Number>().DoubleValue();
  return guarded(info.Env(), [&]() -> Napi::Value {
    for (auto& r : reducers_) r->setLevel(p, level);
    return info.Env().Undefined();
  });
}

Napi::Value ReducerProbeWrap::isCompressed(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), reducers_[0]->isCompressed(parameterArg(info, 0)));
}

Napi::Value ReducerProbeWrap::floatsPerStep(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(reducers_[0]->floatsPerStep()));
}

// norms(worker) → Float64Array of ‖Σ g‖ per parameter, restarting the sums
Napi::Value ReducerProbeWrap::norms(const Napi::CallbackInfo& info) {
  GradientReducer& r = reducer(info, 0);
  return guarded(info.Env(), [&]() -> Napi::Value { return float64Array(info.Env(), r.takeGradientNorms()); });
}

}  // namespace accordion::napi

namespace accordion::napi {

// randomize(seed): fills every worker's gradients with standard normal values, natively.
Napi::Value ReducerProbeWrap::randomize(const Napi::CallbackInfo& info) {
  Random rng(static_cast<uint64_t>(info[0].As<Napi::Number>().Int64Value()));
  for (size_t w = 0; w < parameters_.size(); ++w)
    for (auto& p : parameters_[w]) {
      Tensor host(p.grad.shape());
      for (int64_t k = 0; k < host.numel(); ++k) host.data()[k] = rng.normal();
      backends_[w]->upload(p.grad.data(), host.data(), host.bytes());
    }
  return info.Env().Undefined();
}

// setInput(grads: Float32Array[][] indexed [worker][parameter]): sets every worker's gradients, as
// step() does without reducing, and keeps a copy of them on the probe's device for restart().
Napi::Value ReducerProbeWrap::setInput(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t workers = reducers_.size();
  if (!info[0].IsArray() || info[0].As<Napi::Array>().Length() != workers) throw typeError(env, "grads must hold one array per worker");
  Napi::Array grads = info[0].As<Napi::Array>();
  inputs_.assign(workers, {});
  for (size_t w = 0; w < workers; ++w) {
    if (!grads.Get(static_cast<uint32_t>(w)).IsArray()) throw typeError(env, "grads[" + std::to_string(w) + "] must be an array");
    Napi::Array list = grads.Get(static_cast<uint32_t>(w)).As<Napi::Array>();
    if (list.Length() != parameters_[w].size()) throw typeError(env, "grads[" + std::to_string(w) + "] must hold one array per parameter");
    for (size_t i = 0; i < parameters_[w].size(); ++i) {
      Tensor& g = parameters_[w][i].grad;
      Napi::Value v = list.Get(static_cast<uint32_t>(i));
      if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array ||
          static_cast<int64_t>(v.As<Napi::Float32Array>().ElementLength()) != g.numel())
        throw typeError(env, "gradient " + std::to_string(i) + " must be a Float32Array of " + std::to_string(g.numel()) + " floats");
      backends_[w]->upload(g.data(), v.As<Napi::Float32Array>().Data(), g.bytes());
      inputs_[w].push_back(backends_[w]->empty(g.shape()));
      backends_[w]->copy(inputs_[w].back().data(), g.data(), g.bytes());
    }
    backends_[w]->synchronize();  // the arrays may change once this returns
  }
  return env.Undefined();
}

// restart(): the gradients of the last setInput() again, and error feedback restarted (zero
// memories, Q drawn again from the seed): the state of the first round, for timing that round.
Napi::Value ReducerProbeWrap::restart(const Napi::CallbackInfo& info) {
  if (inputs_.empty()) throw typeError(info.Env(), "restart() needs setInput() first");
  return guarded(info.Env(), [&]() -> Napi::Value {
    for (size_t w = 0; w < reducers_.size(); ++w) {
      for (size_t i = 0; i < parameters_[w].size(); ++i)
        backends_[w]->copy(parameters_[w][i].grad.data(), inputs_[w][i].data(), inputs_[w][i].bytes());
      reducers_[w]->resetErrorFeedback();
      backends_[w]->synchronize();  // nothing of the restart is left to the timed round
    }
    return info.Env().Undefined();
  });
}

// run() → floats sent: one reduce of the single worker's current gradients, without copies through
// JS (for benchmarks; the gradients are replaced by the reduced ones, as in training).
Napi::Value ReducerProbeWrap::run(const Napi::CallbackInfo& info) {
  if (reducers_.size() != 1) throw typeError(info.Env(), "run() is for a single worker; use step() for several");
  return guarded(info.Env(), [&]() -> Napi::Value {
    const double floats = static_cast<double>(reducers_[0]->reduce().floatsSent);
    backends_[0]->synchronize();  // the reduction is done when run() returns, on any device
    return Napi::Number::New(info.Env(), floats);
  });
}

}  // namespace accordion::napi
