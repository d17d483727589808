// JS class ReducerProbe: W in-process workers compressing and exchanging given gradients.
#include <exception>
#include <thread>

#include "compress/staged_group.h"
#include "napi/classes.h"

namespace accordion::napi {

Napi::Function ReducerProbeWrap::define(Napi::Env env) {
  return DefineClass(env, "ReducerProbe",
                     {method<&ReducerProbeWrap::step>("step"), method<&ReducerProbeWrap::memory>("memory"),
                      method<&ReducerProbeWrap::q>("q"), method<&ReducerProbeWrap::setQ>("setQ"),
                      method<&ReducerProbeWrap::level>("level"), method<&ReducerProbeWrap::setLevel>("setLevel"),
                      method<&ReducerProbeWrap::isCompressed>("isCompressed"),
                      method<&ReducerProbeWrap::floatsPerStep>("floatsPerStep"),
                      method<&ReducerProbeWrap::buckets>("buckets"),
                      method<&ReducerProbeWrap::norms>("norms"),
                      method<&ReducerProbeWrap::levelCosts>("levelCosts"),
                      method<&ReducerProbeWrap::randomize>("randomize"),
                      method<&ReducerProbeWrap::setInput>("setInput"), method<&ReducerProbeWrap::restart>("restart"),
                      method<&ReducerProbeWrap::run>("run")});
}

// A tensor of `backend` as a flat Float32Array.
static Napi::Value flat(Napi::Env env, Backend& backend, const Tensor& t) {
  return toJs(env, backend.toHost(t).reshaped({t.numel()}));
}

// A probe is for small tensors: at most this many workers, parameters, and elements per parameter.
constexpr int64_t kMaxWorkers = 64, kMaxParameters = 4096, kMaxParameterElements = int64_t{1} << 26;

// new ReducerProbe(shapes: number[][], { compressor, level, workers, seed, minCompressionRate, commDtype, accumulateNorms, group, device })
// With `group` (a connected ProcessGroup) the probe is this process's single worker of a real job.
// On a GPU (`device` 'cuda' or 'cuda:N') each worker has its own backend there, and the collectives
// stage through host memory.
ReducerProbeWrap::ReducerProbeWrap(const Napi::CallbackInfo& info) try : GuardedWrap<ReducerProbeWrap>(info) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray() || !info[1].IsObject()) throw typeError(env, "expected (shapes, options)");
  Napi::Array shapeList = info[0].As<Napi::Array>();
  Napi::Object o = info[1].As<Napi::Object>();
  if (shapeList.Length() > kMaxParameters)
    throw rangeError(env, "shapes lists " + std::to_string(shapeList.Length()) + " parameters, at most " + std::to_string(kMaxParameters));
  std::vector<Shape> shapes;
  for (uint32_t i = 0; i < shapeList.Length(); ++i) {
    const std::string what = "shapes[" + std::to_string(i) + "]";
    shapes.push_back(shapeArg(env, shapeList.Get(i), what.c_str()));
    if (shapes.back().empty()) throw rangeError(env, what + " must have at least one dimension");
    for (int64_t d : shapes.back())
      if (d < 1) throw rangeError(env, what + " " + shapeString(shapes.back()) + " has a dimension below 1");
    elementCount(env, shapes.back(), what, kMaxParameterElements);
  }
  Napi::Value groupValue = o.Get("group");
  if (!groupValue.IsUndefined()) {
    if (!isProcessGroup(groupValue)) throw typeError(env, "option 'group' must be a ProcessGroup");
    auto* wrap = ProcessGroupWrap::Unwrap(groupValue.As<Napi::Object>());
    processGroup_ = wrap->group();
    if (!processGroup_) throw makeError(env, "ERR_NOT_READY", "the process group is not connected");
  }
  const int workers = processGroup_ ? 1 : static_cast<int>(intOption(o, "workers", 1, 1, kMaxWorkers));
  ReducerOptions options;
  options.compressor = parseCompressor(stringOption(o, "compressor", "none"));
  options.level = numberOption(o, "level", options.compressor == Compressor::TopK ? 0.1 : 1);
  options.seed = static_cast<uint64_t>(intOption(o, "seed", 42, 0, kMaxSafeInteger));
  options.minCompressionRate = numberOption(o, "minCompressionRate", 1.0);
  if (options.minCompressionRate < 0) throw rangeError(env, "option 'minCompressionRate' must be ≥ 0");
  options.accumulateNorms = boolOption(o, "accumulateNorms", false);
  options.sent = parsePrecision(stringOption(o, "commDtype", "fp32"));
  const int64_t bucketBytes = intOption(o, "bucketBytes", 0, 0, kMaxSafeInteger);
  const Device device = parseDevice(stringOption(o, "device", "cpu"));
  group_ = std::make_unique<InProcessGroup>(workers);
  parameters_.resize(workers);
  for (int w = 0; w < workers; ++w) {
    backends_.push_back(makeBackend(device));  // one per worker thread
    Backend& backend = *backends_[w];
    for (size_t i = 0; i < shapes.size(); ++i)
      parameters_[w].push_back(Parameter{"p" + std::to_string(i), backend.zeros(shapes[i]), backend.zeros(shapes[i])});
    std::vector<Parameter*> pointers;
    for (auto& p : parameters_[w]) pointers.push_back(&p);
    ProcessGroup* group = processGroup_ ? processGroup_.get() : &group_->member(w);
    if (device.isCuda()) {
      staged_.push_back(std::make_unique<StagedGroup>(*group, backend));
      group = staged_.back().get();
    }
    reducers_.push_back(std::make_unique<GradientReducer>(pointers, options, *group, backend));
    if (bucketBytes > 0) exchanges_.push_back(std::make_unique<BucketExchange>(*reducers_.back(), pointers, bucketBytes));
  }
} catch (...) {
  rethrowAsJs(info.Env());
}

GradientReducer& ReducerProbeWrap::reducer(const Napi::CallbackInfo& info, size_t workerArg) {
  return *reducers_[workerIndex(info, workerArg)];
}

size_t ReducerProbeWrap::workerIndex(const Napi::CallbackInfo& info, size_t index) {
  return static_cast<size_t>(intArg(info, index, "worker", 0, static_cast<int64_t>(reducers_.size()) - 1));
}

size_t ReducerProbeWrap::parameterArg(const Napi::CallbackInfo& info, size_t index) {
  if (parameters_[0].empty()) throw rangeError(info.Env(), "the probe has no parameters");
  return static_cast<size_t>(intArg(info, index, "parameter", 0, static_cast<int64_t>(parameters_[0].size()) - 1));
}

// step(grads: Float32Array[][] indexed [worker][parameter]) → { outputs: Float32Array[][], floatsSent, bytesSent,
//   collectiveBytes: Float64Array (worker 0's collectives in the order they ran: the bytes it sent) }
Napi::Value ReducerProbeWrap::step(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const size_t workers = reducers_.size();
  if (!info[0].IsArray() || info[0].As<Napi::Array>().Length() != workers) throw typeError(env, "grads must hold one array per worker");
  Napi::Array grads = info[0].As<Napi::Array>();
  // Every gradient is checked before any is uploaded.
  std::vector<std::vector<Napi::Float32Array>> arrays(workers);
  for (size_t w = 0; w < workers; ++w) {
    Napi::Value list = grads.Get(static_cast<uint32_t>(w));
    if (!list.IsArray() || list.As<Napi::Array>().Length() != parameters_[w].size())
      throw typeError(env, "grads[" + std::to_string(w) + "] must hold one Float32Array per parameter (" +
                               std::to_string(parameters_[w].size()) + ")");
    for (size_t i = 0; i < parameters_[w].size(); ++i) {
      Napi::Value a = list.As<Napi::Array>().Get(static_cast<uint32_t>(i));
      const std::string what = "grads[" + std::to_string(w) + "][" + std::to_string(i) + "]";
      if (!a.IsTypedArray() || a.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
        throw typeError(env, what + " must be a Float32Array");
      if (static_cast<int64_t>(a.As<Napi::Float32Array>().ElementLength()) != parameters_[w][i].grad.numel())
        throw typeError(env, what + " must hold " + std::to_string(parameters_[w][i].grad.numel()) + " floats");
      arrays[w].push_back(a.As<Napi::Float32Array>());
    }
  }
  for (size_t w = 0; w < workers; ++w)
    for (size_t i = 0; i < parameters_[w].size(); ++i) {
      Tensor& g = parameters_[w][i].grad;
      backends_[w]->upload(g.data(), arrays[w][i].Data(), g.bytes());
    }
  std::vector<ReduceResult> results(workers);
  std::vector<std::exception_ptr> failures(workers);
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w)
    threads.emplace_back([&, w] {
      try {
        if (exchanges_.empty()) {
          results[w] = reducers_[w]->reduce();
        } else {
          exchanges_[w]->begin();
          exchanges_[w]->allReady();
          results[w] = exchanges_[w]->finish();
        }
      } catch (...) {
        failures[w] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (size_t w = 0; w < workers; ++w)
    if (failures[w]) std::rethrow_exception(failures[w]);
  Napi::Object out = Napi::Object::New(env);
  Napi::Array outputs = Napi::Array::New(env, workers);
  for (size_t w = 0; w < workers; ++w) {
    Napi::Array list = Napi::Array::New(env, parameters_[w].size());
    for (size_t i = 0; i < parameters_[w].size(); ++i) list.Set(static_cast<uint32_t>(i), flat(env, *backends_[w], parameters_[w][i].grad));
    outputs.Set(static_cast<uint32_t>(w), list);
  }
  out.Set("outputs", outputs);
  out.Set("floatsSent", static_cast<double>(results[0].floatsSent));
  out.Set("bytesSent", static_cast<double>(results[0].bytesSent));
  std::vector<double> collectives;
  for (const CollectiveTime& c : results[0].collectives) collectives.push_back(c.bytes);
  out.Set("collectiveBytes", float64Array(env, collectives));
  return out;
}

// memory(worker, parameter) → Float32Array | null (flat, PyTorch layout)
Napi::Value ReducerProbeWrap::memory(const Napi::CallbackInfo& info) {
  const Tensor* t = reducer(info, 0).compressorState(parameterArg(info, 1), "memory");
  return t ? flat(info.Env(), *backends_[workerIndex(info, 0)], *t) : info.Env().Null();
}

// q(worker, parameter) → Float32Array | null, row-major (cols, r)
Napi::Value ReducerProbeWrap::q(const Napi::CallbackInfo& info) {
  const Tensor* t = reducer(info, 0).compressorState(parameterArg(info, 1), "q");
  return t ? flat(info.Env(), *backends_[workerIndex(info, 0)], *t) : info.Env().Null();
}

// setQ(parameter, Float32Array) on every worker
Napi::Value ReducerProbeWrap::setQ(const Napi::CallbackInfo& info) {
  const size_t p = parameterArg(info, 0);
  Napi::Float32Array a = float32Arg(info, 1, "q");
  for (size_t w = 0; w < reducers_.size(); ++w) {
    Tensor* q = reducers_[w]->compressorState(p, "q");
    if (!q || q->numel() != static_cast<int64_t>(a.ElementLength()))
      throw typeError(info.Env(), "q must hold " + std::to_string(q ? q->numel() : 0) + " floats");
    backends_[w]->upload(q->data(), a.Data(), q->bytes());
  }
  return info.Env().Undefined();
}

Napi::Value ReducerProbeWrap::level(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), reducers_[0]->level(parameterArg(info, 0)));
}

// setLevel(parameter, level) on every worker
Napi::Value ReducerProbeWrap::setLevel(const Napi::CallbackInfo& info) {
  const size_t p = parameterArg(info, 0);
  if (!info[1].IsNumber()) throw typeError(info.Env(), "level must be a number");
  const double level = info[1].As<Napi::Number>().DoubleValue();
  for (auto& r : reducers_) r->setLevel(p, level);
  return info.Env().Undefined();
}

Napi::Value ReducerProbeWrap::isCompressed(const Napi::CallbackInfo& info) {
  return Napi::Boolean::New(info.Env(), reducers_[0]->isCompressed(parameterArg(info, 0)));
}

Napi::Value ReducerProbeWrap::floatsPerStep(const Napi::CallbackInfo& info) {
  return Napi::Number::New(info.Env(), static_cast<double>(reducers_[0]->floatsPerStep()));
}

// buckets() → number[][]: the parameter indices of each bucket, in the order they travel ([] without bucketBytes)
Napi::Value ReducerProbeWrap::buckets(const Napi::CallbackInfo& info) {
  return indexListsValue(info.Env(), exchanges_.empty() ? std::vector<std::vector<size_t>>{} : exchanges_[0]->buckets());
}

// norms(worker) → Float64Array of ‖Σ g‖ per parameter, restarting the sums
Napi::Value ReducerProbeWrap::norms(const Napi::CallbackInfo& info) {
  return float64Array(info.Env(), reducer(info, 0).takeGradientNorms());
}

// levelCosts(worker, candidates: number[]) → { level, error, floats, seconds }[][] per parameter
Napi::Value ReducerProbeWrap::levelCosts(const Napi::CallbackInfo& info) {
  GradientReducer& r = reducer(info, 0);
  return levelCostsValue(info.Env(), r.levelCosts(levelList(info.Env(), info[1])));
}

}  // namespace accordion::napi

namespace accordion::napi {

// randomize(seed): fills every worker's gradients with standard normal values, natively.
Napi::Value ReducerProbeWrap::randomize(const Napi::CallbackInfo& info) {
  Random rng(static_cast<uint64_t>(intArg(info, 0, "seed", 0, kMaxSafeInteger)));
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
  for (size_t w = 0; w < reducers_.size(); ++w) {
    for (size_t i = 0; i < parameters_[w].size(); ++i)
      backends_[w]->copy(parameters_[w][i].grad.data(), inputs_[w][i].data(), inputs_[w][i].bytes());
    reducers_[w]->resetErrorFeedback();
    backends_[w]->synchronize();  // nothing of the restart is left to the timed round
  }
  return info.Env().Undefined();
}

// run() → floats sent: one reduce of the single worker's current gradients, without copies through
// JS (for benchmarks; the gradients are replaced by the reduced ones, as in training).
Napi::Value ReducerProbeWrap::run(const Napi::CallbackInfo& info) {
  if (reducers_.size() != 1) throw typeError(info.Env(), "run() is for a single worker; use step() for several");
  const double floats = static_cast<double>(reducers_[0]->reduce().floatsSent);
  backends_[0]->synchronize();  // the reduction is done when run() returns, on any device
  return Napi::Number::New(info.Env(), floats);
}

}  // namespace accordion::napi
