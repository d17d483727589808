// JS class Engine: a Session driven through promises; its construction, steps, evaluation and
// forward here, the methods on its state in engine_state.cpp.
#include <cmath>
#include <cstring>

#include "comm/nccl.h"
#include "core/cuda.h"
#include "napi/classes.h"

namespace accordion::napi {

Napi::Function EngineWrap::define(Napi::Env env) {
  return DefineClass(env, "Engine",
                     {method<&EngineWrap::ready>("ready"), method<&EngineWrap::trainStep>("trainStep"),
                      method<&EngineWrap::evaluate>("evaluate"),
                      method<&EngineWrap::setLearningRate>("setLearningRate"),
                      method<&EngineWrap::getState>("getState"), method<&EngineWrap::setState>("setState"),
                      method<&EngineWrap::levels>("levels"), method<&EngineWrap::setLevels>("setLevels"),
                      method<&EngineWrap::gradientNorms>("gradientNorms"),
                      method<&EngineWrap::levelCosts>("levelCosts"),
                      method<&EngineWrap::broadcastState>("broadcastState"),
                      method<&EngineWrap::broadcastBuffers>("broadcastBuffers"),
                      method<&EngineWrap::stateDigests>("stateDigests"),
                      method<&EngineWrap::resetState>("resetState"),
                      method<&EngineWrap::memoryStats>("memoryStats"),
                      method<&EngineWrap::collectiveCounts>("collectiveCounts"),
                      method<&EngineWrap::exchangePlan>("exchangePlan"),
                      method<&EngineWrap::forward>("forward"),
                      method<&EngineWrap::gradients>("gradients"),
                      method<&EngineWrap::hiddenState>("hiddenState"),
                      method<&EngineWrap::setHiddenState>("setHiddenState"),
                      method<&EngineWrap::dispose>("dispose")});
}

// A batch object in host memory: { images: Float32Array (N, 3, H, W) NCHW, height, width, labels?:
// Int32Array (N), count? } or { tokens: Int32Array (T, B) time-major, steps, batch, targets?: Int32Array
// (T·B) }. Without labels (or targets) only the logits are computed, and `count` gives N.
static HostBatch hostBatch(Napi::Env env, const Napi::Value& value, const char* what) {
  if (!value.IsObject()) throw typeError(env, std::string(what) + " must be a batch object");
  Napi::Object o = value.As<Napi::Object>();
  HostBatch b;
  const auto int32s = [&](const char* key, bool required) -> Napi::Int32Array {
    Napi::Value v = o.Get(key);
    if (v.IsUndefined() && !required) return Napi::Int32Array();
    if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_int32_array)
      throw typeError(env, std::string(what) + "." + key + " must be an Int32Array");
    return v.As<Napi::Int32Array>();
  };
  if (o.Has("tokens")) {
    Napi::Int32Array tokens = int32s("tokens", true), targets = int32s("targets", false);
    b.steps = intOption(o, "steps", 1, kMaxDimension);
    b.columns = intOption(o, "batch", 1, kMaxDimension);
    const int64_t n = b.steps * b.columns;
    if (static_cast<int64_t>(tokens.ElementLength()) != n || (!targets.IsEmpty() && static_cast<int64_t>(targets.ElementLength()) != n))
      throw typeError(env, std::string(what) + ": tokens and targets must hold steps × batch token ids");
    b.tokens = tokens.Data();
    if (!targets.IsEmpty()) b.labels = targets.Data();
    return b;
  }
  Napi::Value images = o.Get("images");
  if (!images.IsTypedArray() || images.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
    throw typeError(env, std::string(what) + ".images must be a Float32Array");
  Napi::Int32Array labels = int32s("labels", false);
  b.height = intOption(o, "height", 1, kMaxDimension);
  b.width = intOption(o, "width", 1, kMaxDimension);
  b.count = labels.IsEmpty() ? intOption(o, "count", 1, kMaxDimension) : static_cast<int64_t>(labels.ElementLength());
  if (b.count < 1 || static_cast<int64_t>(images.As<Napi::Float32Array>().ElementLength()) !=
                         elementCount(env, {b.count, 3, b.height, b.width}, "images (N, 3, H, W)"))
    throw typeError(env, std::string(what) + ".images must hold N×3×H×W floats" + (labels.IsEmpty() ? "" : " for N labels"));
  b.images = images.As<Napi::Float32Array>().Data();
  if (!labels.IsEmpty()) b.labels = labels.Data();
  return b;
}

// The NCCL communicator of the workers of `gloo`, for a model on `device`, meeting through the job's store.
static cuda::NcclOptions ncclOptions(const GlooGroup& gloo, const Device& device, int communicator) {
  cuda::NcclOptions o;
  o.rank = gloo.rank();
  o.size = gloo.size();
  o.device = device.index;
  o.timeout = gloo.options().timeout;
  o.prefix = gloo.options().prefix + "/engine-" + std::to_string(communicator);
  o.hostname = gloo.options().hostname;
  return o;
}

// new Engine({ model, classes, width, precision, hidden, layers, seed, dropout, device, convAlgorithms, tf32, memoryFormat, learningRate,
//              momentum, weightDecay, nesterov, compressor, level (with a compressor),
//              compressionSeed, minCompressionRate, commDtype, bucketBytes, broadcastBuffers, clipNorm, distBackend, and optionally
//              accumulateNorms, frozenBatchNorm, keepGradients, threads, group })
// Every training option is required: its default is decided once, in the TypeScript option table
// (Model.create fills them in); the binding checks only what the engine cannot run with.
// With `group` (a ProcessGroup) gradients are exchanged with the other workers and the engine's work
// runs on the group's thread.
EngineWrap::EngineWrap(const Napi::CallbackInfo& info) try : GuardedWrap<EngineWrap>(info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsObject()) throw typeError(env, "Engine options must be an object");
  Napi::Object o = info[0].As<Napi::Object>();
  ModelSpec spec;
  spec.architecture = stringOption(o, "model");
  spec.classes = intOption(o, "classes", 2, kMaxClasses);
  spec.hidden = intOption(o, "hidden", 1, kMaxHidden);
  spec.layers = intOption(o, "layers", 1, kMaxLayers);
  spec.seed = static_cast<uint64_t>(intOption(o, "seed", 0, kMaxSafeInteger));
  spec.dropout = static_cast<float>(numberOption(o, "dropout"));
  spec.width = numberOption(o, "width");
  if (!(spec.width > 0.0 && spec.width <= 16.0)) throw rangeError(env, "option 'width' must be in (0, 16], got " + std::to_string(spec.width));
  SgdOptions sgd{numberOption(o, "learningRate"), numberOption(o, "momentum"), numberOption(o, "weightDecay"), boolOption(o, "nesterov")};
  ReducerOptions reducer;
  reducer.compressor = parseCompressor(stringOption(o, "compressor"));
  const Device device = parseDevice(stringOption(o, "device"));
  if (reducer.compressor != Compressor::None) reducer.level = numberOption(o, "level");
  reducer.seed = static_cast<uint64_t>(intOption(o, "compressionSeed", 0, kMaxSafeInteger));
  reducer.minCompressionRate = numberOption(o, "minCompressionRate");
  reducer.sent = parsePrecision(stringOption(o, "commDtype"));
  reducer.accumulateNorms = boolOption(o, "accumulateNorms", false);
  reducer.bucketBytes = intOption(o, "bucketBytes", 0, kMaxSafeInteger);
  int threads = static_cast<int>(intOption(o, "threads", 0, 0, 4096));
  if (threads == 0) threads = defaultThreads();
  const bool frozenBatchNorm = boolOption(o, "frozenBatchNorm", false);
  const bool keepGradients = boolOption(o, "keepGradients", false);
  const bool broadcastBuffers = boolOption(o, "broadcastBuffers");
  const double clipNorm = numberOption(o, "clipNorm");
  BackendOptions backendOptions;
  const std::string convAlgorithms = stringOption(o, "convAlgorithms");
  if (convAlgorithms != "fastest" && convAlgorithms != "accurate")
    throw rangeError(env, "option 'convAlgorithms' must be 'fastest' or 'accurate', got '" + convAlgorithms + "'");
  backendOptions.accurateConvolutions = convAlgorithms == "accurate";
  backendOptions.tf32 = boolOption(o, "tf32");
  if (backendOptions.tf32 && device.isCpu())
    throw makeError(env, "ERR_UNSUPPORTED", "tf32 is a GPU's tensor-core format; the CPU computes fp32 in full (leave out --tf32, or train with --device cuda)");
  const std::string memoryFormat = stringOption(o, "memoryFormat");
  if (memoryFormat != "auto" && memoryFormat != "channels-last" && memoryFormat != "channels-first")
    throw rangeError(env, "option 'memoryFormat' must be 'auto', 'channels-last' or 'channels-first', got '" + memoryFormat + "'");
  if (memoryFormat == "channels-first" && device.isCpu())
    throw makeError(env, "ERR_UNSUPPORTED", "memoryFormat 'channels-first' is for a GPU; the CPU keeps activations channels-last (leave it out, or train with device 'cuda')");
  if (memoryFormat != "auto") backendOptions.channelsLast = memoryFormat == "channels-last";
  const std::string precision = stringOption(o, "precision");
  if (precision != "fp32" && precision != "bf16") throw rangeError(env, "option 'precision' must be 'fp32' or 'bf16', got '" + precision + "'");
  backendOptions.compute = parsePrecision(precision);
  const std::string distBackend = stringOption(o, "distBackend");
  if (distBackend != "nccl" && distBackend != "gloo") throw rangeError(env, "option 'distBackend' must be 'nccl' or 'gloo', got '" + distBackend + "'");
  const bool nccl = distBackend == "nccl";
  ProcessGroupWrap* groupWrap = nullptr;
  Napi::Value group = o.Get("group");
  if (!group.IsUndefined() && !group.IsNull()) {
    if (!isProcessGroup(group))
      throw typeError(env, "option 'group' must be a ProcessGroup");
    groupWrap = ProcessGroupWrap::Unwrap(group.As<Napi::Object>());
    if (!groupWrap->thread()) throw makeError(env, "ERR_DISPOSED", "the process group has been disposed");
    groupRef_ = Napi::Persistent(group.As<Napi::Object>());
    worker_ = groupWrap->thread();
  } else {
    worker_ = std::make_shared<WorkerThread>();
  }
  const int communicator = groupWrap ? groupWrap->nextCommunicator() : 0;
  // Building (and initialising) a model takes up to a second for the largest ones: it is the first
  // job on the engine's thread, and ready() reports its outcome.
  EngineWrap* self = this;
  ready_ = std::make_unique<Napi::ObjectReference>(Napi::Persistent(
      schedule<std::vector<std::pair<std::string, Shape>>>(
          env, *worker_,
          [self, spec, sgd, reducer, groupWrap, frozenBatchNorm, keepGradients, broadcastBuffers, clipNorm, device, communicator,
           threads, backendOptions, nccl] {
            std::shared_ptr<ProcessGroup> group;
            if (groupWrap) {
              std::shared_ptr<GlooGroup> gloo = groupWrap->group();  // connected by the earlier job on this thread, if it succeeded
              if (!gloo) throw EngineError("ERR_NOT_READY", "the engine's process group is not connected");
              group = gloo;
              // On GPUs the gradients travel over NCCL, between the same workers (even a single one);
              // with Gloo the session stages them through the host (several workers may share a GPU).
              if (device.isCuda() && nccl) group = cuda::makeNcclGroup(gloo->store(), ncclOptions(*gloo, device, communicator));
            }
            self->session_ = std::make_unique<Session>(spec, sgd, reducer, group, device, threads, backendOptions);
            if (frozenBatchNorm) self->session_->model().freezeBatchNorm(true);
            if (keepGradients) self->session_->keepGradients(true);
            self->session_->setBroadcastBuffers(broadcastBuffers);
            self->session_->setClipNorm(clipNorm);
            std::vector<std::pair<std::string, Shape>> params;
            for (const Parameter* p : self->session_->model().parameters()) params.emplace_back(p->name, p->value.shape());
            return params;
          },
          [](Napi::Env env, std::vector<std::pair<std::string, Shape>>& params) -> Napi::Value {
            Napi::Array out = Napi::Array::New(env, params.size());
            for (size_t i = 0; i < params.size(); ++i) {
              Napi::Object p = Napi::Object::New(env);
              p.Set("name", params[i].first);
              p.Set("shape", shapeValue(env, params[i].second));
              out.Set(static_cast<uint32_t>(i), p);
            }
            return out;
          })
          .As<Napi::Object>()));
} catch (...) {
  rethrowAsJs(info.Env());
}

Session& EngineWrap::session() {
  if (!session_) throw EngineError("ERR_NOT_READY", "the engine's model could not be built (see the error of ready())");
  return *session_;
}

// ready() → Promise<[{ name, shape }]>: the trainable parameters in state_dict order, once the model is built.
Napi::Value EngineWrap::ready(const Napi::CallbackInfo& info) { return ready_->Value(); }

WorkerThread& EngineWrap::worker(Napi::Env env) {
  if (!worker_) throw makeError(env, "ERR_DISPOSED", "the engine has been disposed");
  return *worker_;
}

Batcher& EngineWrap::batcherArg(const Napi::CallbackInfo& info, size_t index) {
  if (info.Length() <= index || !isBatcher(info[index]))
    throw typeError(info.Env(), "expected a Batcher");
  return BatcherWrap::Unwrap(info[index].As<Napi::Object>())->batcher();
}

// trainStep(batcher, microBatches = 1) → Promise<{ loss, correct, samples, … } | null>: one optimiser
// step over the mean gradient of the next `microBatches` batches; null once the epoch is exhausted.
// trainStep(batches: batch objects[]) → Promise<{ … }>: the same over the caller's micro-batches
// (hostBatch above), read on the engine's thread: they must not change until the promise settles.
Napi::Value EngineWrap::trainStep(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  EngineWrap* self = this;
  const auto toJs = [](Napi::Env env, StepResult& r) -> Napi::Value { return stepResultValue(env, r); };
  if (info.Length() > 0 && info[0].IsArray()) {
    Napi::Array list = info[0].As<Napi::Array>();
    std::vector<HostBatch> batches;
    for (uint32_t i = 0; i < list.Length(); ++i) batches.push_back(hostBatch(env, list.Get(i), "trainStep: a batch"));
    if (batches.empty()) throw typeError(env, "trainStep needs at least one batch");
    return schedule<StepResult>(env, worker(env), [self, batches] { return self->session().trainStep(batches); }, toJs,
                                {info.This(), info[0]});
  }
  Batcher& batcher = batcherArg(info, 0);
  const int64_t microBatches = info[1].IsUndefined() ? 1 : intArg(info, 1, "microBatches", 1, kMaxDimension);
  return schedule<std::optional<StepResult>>(
      env, worker(env),
      [self, &batcher, microBatches]() -> std::optional<StepResult> { return self->session().trainStep(batcher, microBatches); },
      [](Napi::Env env, std::optional<StepResult>& r) -> Napi::Value {
        return r ? Napi::Value(stepResultValue(env, *r)) : env.Null();
      },
      {info.This(), info[0]});
}

// evaluate(batcher | batch object) → Promise<{ loss, correct, samples }> over the batcher's current
// epoch, or one batch (hostBatch above), in evaluation mode.
Napi::Value EngineWrap::evaluate(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  EngineWrap* self = this;
  const auto toJs = [](Napi::Env env, StepResult& r) -> Napi::Value { return stepResultValue(env, r); };
  if (info.Length() > 0 && !isBatcher(info[0])) {
    const HostBatch batch = hostBatch(env, info[0], "evaluate: the batch");
    return schedule<StepResult>(env, worker(env), [self, batch] { return self->session().evaluate(batch); }, toJs, {info.This(), info[0]});
  }
  Batcher& batcher = batcherArg(info, 0);
  return schedule<StepResult>(env, worker(env), [self, &batcher] { return self->session().evaluate(batcher); }, toJs,
                              {info.This(), info[0]});
}

// memoryStats(resetPeak) → Promise<{ device, allocated, peak }>: bytes the model's tensors hold now
// (device memory; on the CPU, host memory) and held at most; with resetPeak the peak restarts at the
// bytes held now, after it is read.
Napi::Value EngineWrap::memoryStats(const Napi::CallbackInfo& info) {
  EngineWrap* self = this;
  const bool resetPeak = info.Length() > 0 && info[0].ToBoolean().Value();
  return schedule<std::pair<std::string, Backend::MemoryStats>>(
      info.Env(), worker(info.Env()),
      [self, resetPeak] {
        Backend& backend = self->session().backend();
        auto stats = std::make_pair(backend.device().name(), backend.memoryStats());
        if (resetPeak) backend.resetPeakMemory();
        return stats;
      },
      [](Napi::Env env, std::pair<std::string, Backend::MemoryStats>& stats) -> Napi::Value {
        Napi::Object o = Napi::Object::New(env);
        o.Set("device", stats.first);
        o.Set("allocated", static_cast<double>(stats.second.allocated));
        o.Set("peak", static_cast<double>(stats.second.peak));
        return o;
      },
      {info.This()});
}

// forward(batch object, training) → Promise<Float32Array>: logits (N, classes) of images, or
// (T·B, vocabulary) of a token window, in training or evaluation mode (hostBatch above; labels unused).
Napi::Value EngineWrap::forward(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  const HostBatch batch = hostBatch(env, info[0], "forward: the batch");
  const bool training = info.Length() > 1 && info[1].ToBoolean().Value();
  EngineWrap* self = this;
  return schedule<Tensor>(
      env, worker(env), [self, batch, training] { return self->session().forward(batch, training); },
      [](Napi::Env env, Tensor& logits) -> Napi::Value { return toJs(env, logits, false); }, {info.This(), info[0]});
}

// dispose() → Promise<void>: frees the model once queued work has finished; later calls fail.
Napi::Value EngineWrap::dispose(const Napi::CallbackInfo& info) {
  EngineWrap* self = this;
  return retire(info.Env(), worker_, [self] { self->session_.reset(); }, info.This());
}

}  // namespace accordion::napi
