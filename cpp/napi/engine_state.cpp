// JS class Engine, the methods on its state: the learning rate, the state_dict, levels and their
// costs, gradient norms, broadcasts and digests, the collectives' counts, kept gradients and the
// language model's carried state.
#include <cmath>
#include <cstring>

#include "napi/classes.h"

namespace accordion::napi {

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

}  // namespace accordion::napi
