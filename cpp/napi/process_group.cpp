// JS class ProcessGroup: Gloo collectives between worker processes.
#include "napi/classes.h"

namespace accordion::napi {

constexpr int64_t kMaxWorkers = int64_t{1} << 20;

Napi::Function ProcessGroupWrap::define(Napi::Env env) {
  return DefineClass(env, "ProcessGroup",
                     {method<&ProcessGroupWrap::ready>("ready"), method<&ProcessGroupWrap::allReduce>("allReduce"),
                      method<&ProcessGroupWrap::allGather>("allGather"),
                      method<&ProcessGroupWrap::broadcast>("broadcast"), method<&ProcessGroupWrap::barrier>("barrier"),
                      method<&ProcessGroupWrap::collectiveCounts>("collectiveCounts"),
                      method<&ProcessGroupWrap::dispose>("dispose")});
}

// new ProcessGroup({ rank, worldSize, storeHost, storePort, token, hostname, timeoutMs, prefix })
// Connecting waits for every rank, so it happens on the group's thread; ready() reports it.
ProcessGroupWrap::ProcessGroupWrap(const Napi::CallbackInfo& info) try : GuardedWrap<ProcessGroupWrap>(info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsObject()) throw typeError(env, "ProcessGroup options must be an object");
  Napi::Object o = info[0].As<Napi::Object>();
  GlooOptions options;
  options.size = static_cast<int>(intOption(o, "worldSize", 1, 1, kMaxWorkers));
  options.rank = static_cast<int>(intOption(o, "rank", 0, 0, options.size - 1));
  // Every option is required: their defaults are the TypeScript layer's (ProcessGroup.connect).
  options.storeHost = stringOption(o, "storeHost");
  options.storePort = static_cast<int>(intOption(o, "storePort", 0, 65535));
  options.token = stringOption(o, "token", "");
  options.hostname = stringOption(o, "hostname");
  options.timeout = std::chrono::milliseconds(intOption(o, "timeoutMs", 0, kMaxSafeInteger));
  options.prefix = stringOption(o, "prefix", "default");
  rank_ = options.rank;
  size_ = options.size;
  worker_ = std::make_shared<WorkerThread>();
  ProcessGroupWrap* self = this;
  ready_ = std::make_unique<Napi::ObjectReference>(Napi::Persistent(
      schedule<bool>(
          env, *worker_,
          [self, options] {
            self->group_ = std::make_shared<GlooGroup>(options);
            return true;
          },
          [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); })
          .As<Napi::Object>()));
} catch (...) {
  rethrowAsJs(info.Env());
}

Napi::Value ProcessGroupWrap::ready(const Napi::CallbackInfo&) { return ready_->Value(); }

GlooGroup& ProcessGroupWrap::connected() {
  if (!group_) throw EngineError("ERR_NOT_READY", "the process group is not connected (see the error of ready())");
  return *group_;
}

WorkerThread& ProcessGroupWrap::worker(Napi::Env env) {
  if (!worker_) throw makeError(env, "ERR_DISPOSED", "the process group has been disposed");
  return *worker_;
}

// allReduce(data: Float32Array, average = false, commDtype = 'fp32') → Promise<void>: element-wise sum
// (or mean) in place, the values sent in `commDtype` and summed in fp32 (ProcessGroup::allReduceSumAs).
Napi::Value ProcessGroupWrap::allReduce(const Napi::CallbackInfo& info) {
  Napi::Float32Array data = float32Arg(info, 0, "data");
  const bool average = info.Length() > 1 && info[1].ToBoolean().Value();
  if (info.Length() > 2 && !info[2].IsUndefined() && !info[2].IsString()) throw typeError(info.Env(), "commDtype must be a string");
  const Precision sent = info.Length() > 2 && info[2].IsString() ? parsePrecision(info[2].As<Napi::String>().Utf8Value()) : Precision::Fp32;
  float* ptr = data.Data();
  const int64_t count = static_cast<int64_t>(data.ElementLength());
  ProcessGroupWrap* self = this;
  return schedule<bool>(
      info.Env(), worker(info.Env()),
      [self, ptr, count, average, sent] {
        GlooGroup& g = self->connected();
        g.allReduceSumAs(ptr, count, sent);
        if (average)
          for (int64_t i = 0; i < count; ++i) ptr[i] /= static_cast<float>(g.size());
        return true;
      },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); }, {info.This(), info[0]});
}

// allGather(data: Float32Array, counts?: number[], output?: Float32Array) → Promise<Float32Array>: every
// rank's data in rank order. Without counts every rank must give the same length; with counts,
// counts[r] is rank r's. The collective writes into `output` (or a new array) in place.
Napi::Value ProcessGroupWrap::allGather(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array data = float32Arg(info, 0, "data");
  const int64_t count = static_cast<int64_t>(data.ElementLength());
  std::vector<int64_t> counts;
  if (info.Length() > 1 && !info[1].IsUndefined()) {
    counts = integerList(env, info[1], "counts", 0, kMaxElements);
    if (static_cast<int>(counts.size()) != size_)
      throw typeError(env, "counts must have one entry per rank (" + std::to_string(size_) + ")");
    if (counts[rank_] != count)
      throw typeError(env, "counts[" + std::to_string(rank_) + "] is " + std::to_string(counts[rank_]) + " but this rank gives " +
                               std::to_string(count) + " floats");
  }
  int64_t total = count * size_;
  if (!counts.empty()) {
    total = 0;
    for (int64_t c : counts) {
      total += c;
      if (total > kMaxElements) throw rangeError(env, "counts add up to more than " + std::to_string(kMaxElements) + " floats");
    }
  }
  Napi::Float32Array result;
  if (info.Length() > 2 && !info[2].IsUndefined()) {
    result = float32Arg(info, 2, "output");
    if (static_cast<int64_t>(result.ElementLength()) != total)
      throw typeError(env, "output must hold " + std::to_string(total) + " floats, it holds " + std::to_string(result.ElementLength()));
  } else {
    result = Napi::Float32Array::New(env, static_cast<size_t>(total));
  }
  const float* input = data.Data();
  float* output = result.Data();
  ProcessGroupWrap* self = this;
  auto resultRef = std::make_shared<Napi::ObjectReference>(Napi::Persistent(result.As<Napi::Object>()));
  return schedule<bool>(
      env, worker(env),
      [self, input, output, count, counts] {
        GlooGroup& g = self->connected();
        if (counts.empty())
          g.allGather(input, count, output);
        else
          g.allGatherV(input, counts, output);
        return true;
      },
      [resultRef](Napi::Env, bool&) -> Napi::Value { return resultRef->Value(); }, {info.This(), info[0]});
}

// broadcast(data: Float32Array, root) → Promise<void>: root's data copied into every rank's, in place.
Napi::Value ProcessGroupWrap::broadcast(const Napi::CallbackInfo& info) {
  Napi::Float32Array data = float32Arg(info, 0, "data");
  const int root = info[1].IsUndefined() ? 0 : static_cast<int>(intArg(info, 1, "root", 0, size_ - 1));
  float* ptr = data.Data();
  const int64_t count = static_cast<int64_t>(data.ElementLength());
  ProcessGroupWrap* self = this;
  return schedule<bool>(
      info.Env(), worker(info.Env()),
      [self, ptr, count, root] {
        self->connected().broadcast(ptr, count, root);
        return true;
      },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); }, {info.This(), info[0]});
}

Napi::Value ProcessGroupWrap::barrier(const Napi::CallbackInfo& info) {
  ProcessGroupWrap* self = this;
  return schedule<bool>(
      info.Env(), worker(info.Env()),
      [self] {
        self->connected().barrier();
        return true;
      },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); }, {info.This()});
}

// collectiveCounts() → Promise<counts> (convert.h): what this rank's collectives have carried, once
// the collectives queued before it have run.
Napi::Value ProcessGroupWrap::collectiveCounts(const Napi::CallbackInfo& info) {
  ProcessGroupWrap* self = this;
  return schedule<CollectiveCounts>(
      info.Env(), worker(info.Env()), [self] { return self->connected().counts(); },
      [](Napi::Env env, CollectiveCounts& counts) -> Napi::Value { return collectiveCountsValue(env, counts); }, {info.This()});
}

// dispose() → Promise<void>: closes the connections once queued collectives have run.
Napi::Value ProcessGroupWrap::dispose(const Napi::CallbackInfo& info) {
  ProcessGroupWrap* self = this;
  return retire(info.Env(), worker_, [self] { self->group_.reset(); }, info.This());
}

}  // namespace accordion::napi
