// JS class Engine: a Session driven through promises.
#include <cmath>
#include <cstring>

#include "comm/nccl.h"
#include "core/cuda.h"
#include "napi/classes.h"

namespace accordion::napi {

Napi::Function EngineWrap::define(Napi::Env env) {
  return DefineClass(env, "Engine",
                     {method<&EngineWrap::ready>("ready"), method<&EngineWrap::trainStep>("trainStep"),
                      method<&EngineWrap::evaluate>("evaluate"), method<&EngineWrap::predict>("predict"),
                      method<&EngineWrap::setLearningRate>("setLearningRate"),
                      method<&EngineWrap::getState>("getState"), method<&EngineWrap::setState>("setState"),
                      method<&EngineWrap::levels>("levels"), method<&EngineWrap::setLevels>("setLevels"),
                      method<&EngineWrap::gradientNorms>("gradientNorms"),
                      method<&EngineWrap::levelCosts>("levelCosts"),
                      method<&EngineWrap::broadcastState>("broadcastState"),
                      method<&EngineWrap::broadcastBuffers>("broadcastBuffers"),
                      method<&EngineWrap::stateDigests>("stateDigests"),
                      method<&EngineWrap::trainTokens>("trainTokens"),
                      method<&EngineWrap::evaluateTokens>("evaluateTokens"),
                      method<&EngineWrap::resetState>("resetState"),
                      method<&EngineWrap::memoryStats>("memoryStats"),
                      method<&EngineWrap::collectiveCounts>("collectiveCounts"),
                      method<&EngineWrap::exchangePlan>("exchangePlan"),
                      method<&EngineWrap::trainOn>("trainOn"), method<&EngineWrap::forward>("forward"),
                      method<&EngineWrap::forwardTokens>("forwardTokens"),
                      method<&EngineWrap::gradients>("gradients"),
                      method<&EngineWrap::hiddenState>("hiddenState"),
                      method<&EngineWrap::setHiddenState>("setHiddenState"),
                      method<&EngineWrap::dispose>("dispose")});
}

// Bounds of the options and arguments, checked before any arithmetic on them: class ids are int32,
// and image sizes, steps and batches fit in 31 bits.
constexpr int64_t kMaxClasses = (int64_t{1} << 31) - 1, kMaxDimension = (int64_t{1} << 31) - 1;
constexpr int64_t kMaxHidden = int64_t{1} << 20, kMaxLayers = 1024;

// n, height and width at info[first…first+2] of a Float32Array of N×3×H×W images.
static void imageArgs(const Napi::CallbackInfo& info, const Napi::Float32Array& images, size_t first, int64_t& n, int64_t& h,
                      int64_t& w) {
  n = intArg(info, first, "n", 1, kMaxDimension);
  h = intArg(info, first + 1, "height", 1, kMaxDimension);
  w = intArg(info, first + 2, "width", 1, kMaxDimension);
  if (static_cast<int64_t>(images.ElementLength()) != elementCount(info.Env(), {n, 3, h, w}, "images (N, 3, H, W)"))
    throw typeError(info.Env(), "images must hold N×3×H×W floats");
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

// new Engine({ model, classes, hidden, layers, seed, dropout, device, convAlgorithms, learningRate,
//              momentum, weightDecay, nesterov, compressor, level (with a compressor),
//              compressionSeed, minCompressionRate, bucketBytes, broadcastBuffers, and optionally
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
  SgdOptions sgd{numberOption(o, "learningRate"), numberOption(o, "momentum"), numberOption(o, "weightDecay"), boolOption(o, "nesterov")};
  ReducerOptions reducer;
  reducer.compressor = parseCompressor(stringOption(o, "compressor"));
  const Device device = parseDevice(stringOption(o, "device"));
  if (reducer.compressor != Compressor::None) reducer.level = numberOption(o, "level");
  reducer.seed = static_cast<uint64_t>(intOption(o, "compressionSeed", 0, kMaxSafeInteger));
  reducer.minCompressionRate = numberOption(o, "minCompressionRate");
  reducer.accumulateNorms = boolOption(o, "accumulateNorms", false);
  reducer.bucketBytes = intOption(o, "bucketBytes", 0, kMaxSafeInteger);
  int threads = static_cast<int>(intOption(o, "threads", 0, 0, 4096));
  if (threads == 0) threads = defaultThreads();
  const bool frozenBatchNorm = boolOption(o, "frozenBatchNorm", false);
  const bool keepGradients = boolOption(o, "keepGradients", false);
  const bool broadcastBuffers = boolOption(o, "broadcastBuffers");
  BackendOptions backendOptions;
  const std::string convAlgorithms = stringOption(o, "convAlgorithms");
  if (convAlgorithms != "fastest" && convAlgorithms != "accurate")
    throw rangeError(env, "option 'convAlgorithms' must be 'fastest' or 'accurate', got '" + convAlgorithms + "'");
  backendOptions.accurateConvolutions = convAlgorithms == "accurate";
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
          [self, spec, sgd, reducer, groupWrap, frozenBatchNorm, keepGradients, broadcastBuffers, device, communicator, threads,
           backendOptions] {
            std::shared_ptr<ProcessGroup> group;
            if (groupWrap) {
              std::shared_ptr<GlooGroup> gloo = groupWrap->group();  // connected by the earlier job on this thread, if it succeeded
              if (!gloo) throw EngineError("ERR_NOT_READY", "the engine's process group is not connected");
              group = gloo;
              // On GPUs the gradients travel over NCCL, between the same workers (even a single one).
              if (device.isCuda()) group = cuda::makeNcclGroup(gloo->store(), ncclOptions(*gloo, device, communicator));
            }
            self->session_ = std::make_unique<Session>(spec, sgd, reducer, group, device, threads, backendOptions);
            if (frozenBatchNorm) self->session_->model().freezeBatchNorm(true);
            if (keepGradients) self->session_->keepGradients(true);
            self->session_->setBroadcastBuffers(broadcastBuffers);
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
Napi::Value EngineWrap::trainStep(const Napi::CallbackInfo& info) {
  Batcher& batcher = batcherArg(info, 0);
  const int64_t microBatches = info[1].IsUndefined() ? 1 : intArg(info, 1, "microBatches", 1, kMaxDimension);
  EngineWrap* self = this;
  return schedule<std::optional<StepResult>>(
      info.Env(), worker(info.Env()),
      [self, &batcher, microBatches]() -> std::optional<StepResult> { return self->session().trainStep(batcher, microBatches); },
      [](Napi::Env env, std::optional<StepResult>& r) -> Napi::Value {
        return r ? Napi::Value(stepResultValue(env, *r)) : env.Null();
      },
      {info.This(), info[0]});
}

// evaluate(batcher) → Promise<{ loss, correct, samples }> over the batcher's current epoch.
Napi::Value EngineWrap::evaluate(const Napi::CallbackInfo& info) {
  Batcher& batcher = batcherArg(info, 0);
  EngineWrap* self = this;
  return schedule<StepResult>(
      info.Env(), worker(info.Env()), [self, &batcher] { return self->session().evaluate(batcher); },
      [](Napi::Env env, StepResult& r) -> Napi::Value { return stepResultValue(env, r); }, {info.This(), info[0]});
}

// predict(images: Float32Array (N, 3, H, W) in NCHW, n, height, width) → Promise<Float32Array (N, classes)>
Napi::Value EngineWrap::predict(const Napi::CallbackInfo& info) {
  Napi::Float32Array images = float32Arg(info, 0, "images");
  int64_t n, h, w;
  imageArgs(info, images, 1, n, h, w);
  EngineWrap* self = this;
  const float* data = images.Data();
  return schedule<Tensor>(
      info.Env(), worker(info.Env()), [self, data, n, h, w] { return self->session().predict(data, n, h, w); },
      [](Napi::Env env, Tensor& logits) -> Napi::Value { return toJs(env, logits); }, {info.This(), info[0]});
}

Napi::Value EngineWrap::setLearningRate(const Napi::CallbackInfo& info) {
  if (!info[0].IsNumber() || !std::isfinite(info[0].As<Napi::Number>().DoubleValue()))
    throw typeError(info.Env(), "learning rate must be a finite number");
  const double lr = info[0].As<Napi::Number>().DoubleValue();
  EngineWrap* self = this;
  return schedule<bool>(
      info.Env(), worker(info.Env()),
      [self, lr] {
        self->session().optimizer().setLearningRate(lr);
        return true;
      },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); }, {info.This()});
}

// getState(includeTrainer) → Promise<[{ name, dtype, shape, data: ArrayBuffer }]>
Napi::Value EngineWrap::getState(const Napi::CallbackInfo& info) {
  const bool includeTrainer = info.Length() > 0 && info[0].ToBoolean().Value();
  EngineWrap* self = this;
  return schedule<std::vector<StateEntry>>(
      info.Env(), worker(info.Env()), [self, includeTrainer] { return self->session().state(includeTrainer); },
      [](Napi::Env env, std::vector<StateEntry>& entries) -> Napi::Value {
        Napi::Array out = Napi::Array::New(env, entries.size());
        for (size_t i = 0; i < entries.size(); ++i) {
          auto* bytes = new std::vector<uint8_t>(std::move(entries[i].bytes));
          Napi::Object e = Napi::Object::New(env);
          e.Set("name", entries[i].name);
          e.Set("dtype", entries[i].dtype);
          e.Set("shape", shapeValue(env, entries[i].shape));
          e.Set("data", Napi::ArrayBuffer::New(env, bytes->data(), bytes->size(),
                                               [](Napi::Env, void*, std::vector<uint8_t>* owned) { delete owned; }, bytes));
          out.Set(static_cast<uint32_t>(i), e);
        }
        return out;
      },
      {info.This()});
}

// setState([{ name, dtype, shape, data: Uint8Array }]) → Promise<void>; all-or-nothing.
Napi::Value EngineWrap::setState(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray()) throw typeError(env, "state must be an array of entries");
  Napi::Array list = info[0].As<Napi::Array>();
  auto entries = std::make_shared<std::vector<StateEntry>>();
  for (uint32_t i = 0; i < list.Length(); ++i) {
    if (!list.Get(i).IsObject()) throw typeError(env, "state entry " + std::to_string(i) + " must be an object");
    Napi::Object e = list.Get(i).As<Napi::Object>();
    Napi::Value data = e.Get("data");
    if (!data.IsTypedArray()) throw typeError(env, "state entry " + std::to_string(i) + " has no byte data");
    auto bytes = data.As<Napi::TypedArray>();
    const uint8_t* begin = static_cast<const uint8_t*>(bytes.ArrayBuffer().Data()) + bytes.ByteOffset();
    entries->push_back({stringOption(e, "name", ""), stringOption(e, "dtype", ""), shapeArg(env, e.Get("shape"), "shape"),
                        std::vector<uint8_t>(begin, begin + bytes.ByteLength())});
    const auto& entry = entries->back();
    const size_t itemSize = entry.dtype == "F32" ? 4 : 8;
    if (static_cast<size_t>(elementCount(env, entry.shape, "state entry '" + entry.name + "'")) * itemSize != entry.bytes.size())
      throw makeError(env, "ERR_STATE_MISMATCH", "state entry '" + entry.name + "' has " + std::to_string(entry.bytes.size()) +
                                                     " bytes, which does not match " + entry.dtype + " " + shapeString(entry.shape));
  }
  EngineWrap* self = this;
  return schedule<bool>(
      env, worker(env),
      [self, entries] {
        self->session().loadState(*entries);
        return true;
      },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); }, {info.This()});
}

// levels() → Promise<Float64Array>: per parameter, the PowerSGD rank or TopK ratio (0: sent dense).
Napi::Value EngineWrap::levels(const Napi::CallbackInfo& info) {
  EngineWrap* self = this;
  return schedule<std::vector<double>>(
      info.Env(), worker(info.Env()),
      [self] {
        GradientReducer& r = self->session().reducer();
        std::vector<double> out(r.size());
        for (size_t k = 0; k < r.size(); ++k) out[k] = r.level(k);
        return out;
      },
      [](Napi::Env env, std::vector<double>& v) -> Napi::Value { return float64Array(env, v); }, {info.This()});
}

// setLevels(Float64Array) → Promise<void>: one level per parameter (0 or NaN entries of 1-D
// parameters are ignored). All levels are validated before any is applied.
Napi::Value EngineWrap::setLevels(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsTypedArray() || info[0].As<Napi::TypedArray>().TypedArrayType() != napi_float64_array)
    throw typeError(env, "levels must be a Float64Array");
  auto array = info[0].As<Napi::Float64Array>();
  std::vector<double> levels(array.Data(), array.Data() + array.ElementLength());
  EngineWrap* self = this;
  return schedule<bool>(
      env, worker(env),
      [self, levels] {
        GradientReducer& r = self->session().reducer();
        if (levels.size() != r.size())
          throw invalidArgument("expected " + std::to_string(r.size()) + " levels, got " + std::to_string(levels.size()));
        auto settable = [&](size_t k) { return r.parameter(k).value.rank() > 1; };
        for (size_t k = 0; k < r.size(); ++k)
          if (settable(k)) r.checkLevel(levels[k], "level of '" + r.parameter(k).name + "'");
        for (size_t k = 0; k < r.size(); ++k)
          if (settable(k)) r.setLevel(k, levels[k]);
        return true;
      },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); }, {info.This()});
}

// levelCosts(candidates: number[]) → Promise<{ level, error, floats, seconds }[][]>: per parameter,
// each candidate level's cost on the epoch's gradient sum (GradientReducer::levelCosts; needs
// accumulateNorms). Call it before gradientNorms(), which restarts the sums.
Napi::Value EngineWrap::levelCosts(const Napi::CallbackInfo& info) {
  std::vector<double> candidates = levelList(info.Env(), info[0]);
  EngineWrap* self = this;
  return schedule<std::vector<std::vector<LevelCost>>>(
      info.Env(), worker(info.Env()), [self, candidates] { return self->session().reducer().levelCosts(candidates); },
      [](Napi::Env env, std::vector<std::vector<LevelCost>>& costs) -> Napi::Value { return levelCostsValue(env, costs); },
      {info.This()});
}

// gradientNorms() → Promise<Float64Array>: ‖Σ g‖₂ per parameter since the last call (needs
// accumulateNorms), then restarts the sums.
Napi::Value EngineWrap::gradientNorms(const Napi::CallbackInfo& info) {
  EngineWrap* self = this;
  return schedule<std::vector<double>>(
      info.Env(), worker(info.Env()), [self] { return self->session().reducer().takeGradientNorms(); },
      [](Napi::Env env, std::vector<double>& v) -> Napi::Value { return float64Array(env, v); }, {info.This()});
}

// Token windows of the language model: (T, B) time-major Int32Arrays of inputs and targets.
static void tokenArgs(const Napi::CallbackInfo& info, const int32_t*& inputs, const int32_t*& targets, int64_t& steps, int64_t& batch) {
  Napi::Env env = info.Env();
  auto in = int32Arg(info, 0, "inputs"), out = int32Arg(info, 1, "targets");
  steps = intArg(info, 2, "steps", 1, kMaxDimension);
  batch = intArg(info, 3, "batch", 1, kMaxDimension);
  const int64_t n = steps * batch;
  if (static_cast<int64_t>(in.ElementLength()) != n || static_cast<int64_t>(out.ElementLength()) != n)
    throw typeError(env, "inputs and targets must hold steps × batch token ids");
  inputs = in.Data();
  targets = out.Data();
}

// trainTokens(inputs, targets, steps, batch, clipNorm) → Promise<StepResult>
Napi::Value EngineWrap::trainTokens(const Napi::CallbackInfo& info) {
  const int32_t *inputs, *targets;
  int64_t steps, batch;
  tokenArgs(info, inputs, targets, steps, batch);
  const double clip = info[4].IsUndefined() ? 0.0 : info[4].IsNumber() ? info[4].As<Napi::Number>().DoubleValue() : -1.0;
  if (!(clip >= 0 && std::isfinite(clip))) throw typeError(info.Env(), "clipNorm must be a finite number ≥ 0");
  EngineWrap* self = this;
  return schedule<StepResult>(
      info.Env(), worker(info.Env()),
      [self, inputs, targets, steps, batch, clip] { return self->session().trainTokens(inputs, targets, steps, batch, clip); },
      [](Napi::Env env, StepResult& r) -> Napi::Value { return stepResultValue(env, r); }, {info.This(), info[0], info[1]});
}

// evaluateTokens(inputs, targets, steps, batch) → Promise<StepResult>
Napi::Value EngineWrap::evaluateTokens(const Napi::CallbackInfo& info) {
  const int32_t *inputs, *targets;
  int64_t steps, batch;
  tokenArgs(info, inputs, targets, steps, batch);
  EngineWrap* self = this;
  return schedule<StepResult>(
      info.Env(), worker(info.Env()),
      [self, inputs, targets, steps, batch] { return self->session().evaluateTokens(inputs, targets, steps, batch); },
      [](Napi::Env env, StepResult& r) -> Napi::Value { return stepResultValue(env, r); }, {info.This(), info[0], info[1]});
}

// resetState() → Promise<void>: zeroes the language model's carried hidden and cell states.
Napi::Value EngineWrap::resetState(const Napi::CallbackInfo& info) {
  EngineWrap* self = this;
  return schedule<bool>(
      info.Env(), worker(info.Env()),
      [self] {
        if (LanguageModel* lm = self->session().model().language()) lm->resetState();
        return true;
      },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); }, {info.This()});
}

// broadcastState(root) → Promise<void>: every parameter and buffer (running statistics) takes rank
// root's values, so all workers start from identical weights.
Napi::Value EngineWrap::broadcastState(const Napi::CallbackInfo& info) {
  const int root = info[0].IsUndefined() ? 0 : static_cast<int>(intArg(info, 0, "root", 0, kMaxDimension));
  EngineWrap* self = this;
  return schedule<bool>(
      info.Env(), worker(info.Env()),
      [self, root] {
        self->session().broadcastState(root);
        return true;
      },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); }, {info.This()});
}

// broadcastBuffers(root) → Promise<number>: every buffer (running statistics) takes rank root's values,
// in one broadcast; resolves to the floats broadcast (0 without buffers or a group).
Napi::Value EngineWrap::broadcastBuffers(const Napi::CallbackInfo& info) {
  const int root = info[0].IsUndefined() ? 0 : static_cast<int>(intArg(info, 0, "root", 0, kMaxDimension));
  EngineWrap* self = this;
  return schedule<int64_t>(
      info.Env(), worker(info.Env()), [self, root] { return self->session().broadcastBuffers(root); },
      [](Napi::Env env, int64_t& floats) -> Napi::Value { return Napi::Number::New(env, static_cast<double>(floats)); },
      {info.This()});
}

// stateDigests() → Promise<{ names: string[], digests: BigUint64Array }>: a 64-bit digest of every
// state_dict entry, in order.
Napi::Value EngineWrap::stateDigests(const Napi::CallbackInfo& info) {
  EngineWrap* self = this;
  return schedule<std::vector<std::pair<std::string, uint64_t>>>(
      info.Env(), worker(info.Env()), [self] { return self->session().stateDigests(); },
      [](Napi::Env env, std::vector<std::pair<std::string, uint64_t>>& entries) -> Napi::Value {
        Napi::Array names = Napi::Array::New(env, entries.size());
        auto digests = Napi::TypedArrayOf<uint64_t>::New(env, entries.size(), napi_biguint64_array);
        for (size_t i = 0; i < entries.size(); ++i) {
          names.Set(static_cast<uint32_t>(i), entries[i].first);
          digests[i] = entries[i].second;
        }
        Napi::Object o = Napi::Object::New(env);
        o.Set("names", names);
        o.Set("digests", digests);
        return o;
      },
      {info.This()});
}

// collectiveCounts() → Promise<counts> (convert.h): what the collectives of the group the gradients
// travel on have carried so far (Gloo on the CPU, NCCL on GPUs), after the work queued before it.
Napi::Value EngineWrap::collectiveCounts(const Napi::CallbackInfo& info) {
  EngineWrap* self = this;
  return schedule<CollectiveCounts>(
      info.Env(), worker(info.Env()), [self] { return self->session().group().counts(); },
      [](Napi::Env env, CollectiveCounts& counts) -> Napi::Value { return collectiveCountsValue(env, counts); }, {info.This()});
}

// exchangePlan() → Promise<{ computeThreads, communicationThreads, buckets }>: the thread budget's
// split, and with an overlapped exchange its buckets (parameter indices, in the order they travel;
// [] when the exchange follows backward).
Napi::Value EngineWrap::exchangePlan(const Napi::CallbackInfo& info) {
  struct Plan {
    int computeThreads;
    std::vector<std::vector<size_t>> buckets;
  };
  EngineWrap* self = this;
  return schedule<Plan>(
      info.Env(), worker(info.Env()),
      [self] {
        Session& s = self->session();
        return Plan{s.computeThreads(), s.bucketExchange() ? s.bucketExchange()->buckets() : std::vector<std::vector<size_t>>{}};
      },
      [](Napi::Env env, Plan& plan) -> Napi::Value {
        Napi::Object o = Napi::Object::New(env);
        o.Set("computeThreads", plan.computeThreads);
        o.Set("communicationThreads", plan.buckets.empty() ? 0 : 1);
        o.Set("buckets", indexListsValue(env, plan.buckets));
        return o;
      },
      {info.This()});
}

// memoryStats() → Promise<{ device, allocated, peak }>: bytes of device memory the model's tensors hold
// now and held at most (0 on the CPU, whose memory is not counted).
Napi::Value EngineWrap::memoryStats(const Napi::CallbackInfo& info) {
  EngineWrap* self = this;
  return schedule<std::pair<std::string, Backend::MemoryStats>>(
      info.Env(), worker(info.Env()),
      [self] { return std::make_pair(self->session().backend().device().name(), self->session().backend().memoryStats()); },
      [](Napi::Env env, std::pair<std::string, Backend::MemoryStats>& stats) -> Napi::Value {
        Napi::Object o = Napi::Object::New(env);
        o.Set("device", stats.first);
        o.Set("allocated", static_cast<double>(stats.second.allocated));
        o.Set("peak", static_cast<double>(stats.second.peak));
        return o;
      },
      {info.This()});
}

// trainOn(images: Float32Array (N, 3, H, W) NCHW, labels: Int32Array (N), height, width) →
// Promise<StepResult>: one optimiser step on the caller's tensors, as trainStep on a batch. The arrays
// are read on the engine's thread: they must not change until the promise settles.
Napi::Value EngineWrap::trainOn(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Float32Array images = float32Arg(info, 0, "images");
  auto labels = int32Arg(info, 1, "labels");
  const int64_t n = static_cast<int64_t>(labels.ElementLength()), h = intArg(info, 2, "height", 1, kMaxDimension),
                w = intArg(info, 3, "width", 1, kMaxDimension);
  if (n <= 0 || static_cast<int64_t>(images.ElementLength()) != elementCount(env, {n, 3, h, w}, "images (N, 3, H, W)"))
    throw typeError(env, "images must hold N×3×H×W floats for N labels");
  EngineWrap* self = this;
  const float* data = images.Data();
  const int32_t* ids = labels.Data();
  return schedule<StepResult>(
      env, worker(env), [self, data, ids, n, h, w] { return self->session().trainStep(data, ids, n, h, w); },
      [](Napi::Env env, StepResult& r) -> Napi::Value { return stepResultValue(env, r); }, {info.This(), info[0], info[1]});
}

// forward(images: Float32Array (N, 3, H, W) NCHW, n, height, width, training) → Promise<Float32Array (N, classes)>
Napi::Value EngineWrap::forward(const Napi::CallbackInfo& info) {
  Napi::Float32Array images = float32Arg(info, 0, "images");
  int64_t n, h, w;
  imageArgs(info, images, 1, n, h, w);
  const bool training = info.Length() > 4 && info[4].ToBoolean().Value();
  EngineWrap* self = this;
  const float* data = images.Data();
  return schedule<Tensor>(
      info.Env(), worker(info.Env()), [self, data, n, h, w, training] { return self->session().forward(data, n, h, w, training); },
      [](Napi::Env env, Tensor& logits) -> Napi::Value { return toJs(env, logits); }, {info.This(), info[0]});
}

// forwardTokens(inputs: Int32Array (T, B), steps, batch, training) → Promise<Float32Array (T·B, vocabulary)>
Napi::Value EngineWrap::forwardTokens(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  auto tokens = int32Arg(info, 0, "tokens");
  const int64_t steps = intArg(info, 1, "steps", 1, kMaxDimension), batch = intArg(info, 2, "batch", 1, kMaxDimension);
  const bool training = info.Length() > 3 && info[3].ToBoolean().Value();
  if (static_cast<int64_t>(tokens.ElementLength()) != steps * batch)
    throw typeError(env, "tokens must hold steps × batch token ids");
  EngineWrap* self = this;
  const int32_t* ids = tokens.Data();
  return schedule<Tensor>(
      env, worker(env), [self, ids, steps, batch, training] { return self->session().forwardTokens(ids, steps, batch, training); },
      [](Napi::Env env, Tensor& logits) -> Napi::Value { return toJs(env, logits, false); }, {info.This(), info[0]});
}

// gradients() → Promise<[{ name, shape, data: Float32Array }]>: the last step's local gradients (with
// the keepGradients option), in state_dict order; [] before the first step.
Napi::Value EngineWrap::gradients(const Napi::CallbackInfo& info) {
  EngineWrap* self = this;
  return schedule<std::vector<StateEntry>>(
      info.Env(), worker(info.Env()), [self] { return self->session().localGradients(); },
      [](Napi::Env env, std::vector<StateEntry>& entries) -> Napi::Value {
        Napi::Array out = Napi::Array::New(env, entries.size());
        for (size_t i = 0; i < entries.size(); ++i) {
          Napi::Float32Array data = Napi::Float32Array::New(env, entries[i].bytes.size() / sizeof(float));
          if (!entries[i].bytes.empty()) std::memcpy(data.Data(), entries[i].bytes.data(), entries[i].bytes.size());
          Napi::Object e = Napi::Object::New(env);
          e.Set("name", entries[i].name);
          e.Set("shape", shapeValue(env, entries[i].shape));
          e.Set("data", data);
          out.Set(static_cast<uint32_t>(i), e);
        }
        return out;
      },
      {info.This()});
}

// hiddenState() → Promise<Float32Array[]>: the language model's carried states, per layer h then c,
// each (B, H) row-major; [] when none is carried (after a reset).
Napi::Value EngineWrap::hiddenState(const Napi::CallbackInfo& info) {
  EngineWrap* self = this;
  return schedule<std::vector<Tensor>>(
      info.Env(), worker(info.Env()),
      [self] {
        LanguageModel* lm = self->session().model().language();
        if (!lm) throw invalidArgument("model '" + self->session().model().spec().architecture + "' carries no hidden state");
        std::vector<Tensor> out;
        for (const Tensor& t : lm->hiddenState()) out.push_back(self->session().backend().toHost(t));
        return out;
      },
      [](Napi::Env env, std::vector<Tensor>& states) -> Napi::Value {
        Napi::Array out = Napi::Array::New(env, states.size());
        for (size_t i = 0; i < states.size(); ++i) out.Set(static_cast<uint32_t>(i), toJs(env, states[i], false));
        return out;
      },
      {info.This()});
}

// setHiddenState(states: Float32Array[] (per layer h then c), batch) → Promise<void>
Napi::Value EngineWrap::setHiddenState(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (!info[0].IsArray()) throw typeError(env, "states must be an array of Float32Arrays");
  const int64_t batch = intArg(info, 1, "batch", 1, kMaxDimension);
  Napi::Array list = info[0].As<Napi::Array>();
  auto states = std::make_shared<std::vector<Tensor>>();
  for (uint32_t i = 0; i < list.Length(); ++i) {
    Napi::Value v = list.Get(i);
    if (!v.IsTypedArray() || v.As<Napi::TypedArray>().TypedArrayType() != napi_float32_array)
      throw typeError(env, "state " + std::to_string(i) + " must be a Float32Array");
    auto a = v.As<Napi::Float32Array>();
    const int64_t n = static_cast<int64_t>(a.ElementLength());
    if (n % batch != 0) throw typeError(env, "state " + std::to_string(i) + " does not hold batch × hidden floats");
    Tensor t({batch, n / batch});
    if (n) std::memcpy(t.data(), a.Data(), n * sizeof(float));
    states->push_back(std::move(t));
  }
  EngineWrap* self = this;
  return schedule<bool>(
      env, worker(env),
      [self, states] {
        LanguageModel* lm = self->session().model().language();
        if (!lm) throw invalidArgument("model '" + self->session().model().spec().architecture + "' carries no hidden state");
        lm->setHiddenState(*states);
        return true;
      },
      [](Napi::Env env, bool&) -> Napi::Value { return env.Undefined(); }, {info.This()});
}

// dispose() → Promise<void>: frees the model once queued work has finished; later calls fail.
Napi::Value EngineWrap::dispose(const Napi::CallbackInfo& info) {
  EngineWrap* self = this;
  return retire(info.Env(), worker_, [self] { self->session_.reset(); }, info.This());
}

}  // namespace accordion::napi
