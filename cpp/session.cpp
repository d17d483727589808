#include "session.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

namespace accordion {

Session::Session(const ModelSpec& model, const SgdOptions& optimizer, const ReducerOptions& reducer,
                 std::shared_ptr<ProcessGroup> group)
    : model_(model),
      optimizer_(model_.parameters(), optimizer),
      group_(group ? std::move(group) : std::make_shared<LocalGroup>()),
      reducer_(std::make_unique<GradientReducer>(model_.parameters(), reducer, *group_)) {}

std::optional<StepResult> Session::trainStep(Batcher& batcher, int64_t microBatches) {
  if (microBatches < 1) throw invalidArgument("a step needs at least one micro-batch, got " + std::to_string(microBatches));
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); };
  const auto start = Clock::now();
  model_.setTraining(true);
  auto& params = model_.parameters();
  StepResult result;
  double lossSum = 0;
  int64_t taken = 0;
  Batch batch;
  for (; taken < microBatches && batcher.next(batch); ++taken) {
    Tensor logits = model_.forward(batch.images);
    int64_t correct = 0;
    const double loss = softmaxCrossEntropy(logits, batch.labels.data(), gradLogits_, &correct);
    if (!std::isfinite(loss))
      throw numericalError("the training loss is " + std::to_string(loss) +
                           "; the update was skipped (lower the learning rate or check the data)");
    model_.backward(gradLogits_);
    lossSum += loss * static_cast<double>(batch.size());
    result.correct += correct;
    result.samples += batch.size();
    if (microBatches == 1) break;
    // A large batch from micro-batches: sum their mean gradients, averaged below.
    if (accumulated_.size() != params.size()) {
      accumulated_.clear();
      for (Parameter* p : params) accumulated_.push_back(Tensor(p->grad.shape()));
    }
    for (size_t k = 0; k < params.size(); ++k) {
      float* sum = accumulated_[k].data();
      const float* g = params[k]->grad.data();
      const int64_t n = params[k]->grad.numel();
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) sum[i] = taken == 0 ? g[i] : sum[i] + g[i];
    }
  }
  if (microBatches == 1 && result.samples > 0) taken = 1;
  if (taken == 0) return std::nullopt;
  if (microBatches > 1) {
    const float inv = 1.0f / static_cast<float>(taken);
    for (size_t k = 0; k < params.size(); ++k) {
      const float* sum = accumulated_[k].data();
      float* g = params[k]->grad.data();
      const int64_t n = params[k]->grad.numel();
#pragma omp parallel for simd schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) g[i] = sum[i] * inv;
    }
  }
  result.loss = lossSum / static_cast<double>(result.samples);
  exchangeAndUpdate(result, seconds(start, Clock::now()));
  return result;
}

void Session::exchangeAndUpdate(StepResult& result, double computeSecondsSoFar) {
  using Clock = std::chrono::steady_clock;
  const auto reduceStart = Clock::now();
  const ReduceResult reduced = reducer_->reduce();
  const auto reduceEnd = Clock::now();
  optimizer_.step();
  result.floatsSent = reduced.floatsSent;
  result.communicationSeconds = reduced.communicationSeconds;
  result.compressionSeconds = std::chrono::duration<double>(reduceEnd - reduceStart).count() - reduced.communicationSeconds;
  result.computeSeconds = computeSecondsSoFar + std::chrono::duration<double>(Clock::now() - reduceEnd).count();
}

LanguageModel& Session::language() {
  if (!model_.language()) throw invalidArgument("model '" + model_.spec().architecture + "' trains on images, not token windows");
  return *model_.language();
}

StepResult Session::trainTokens(const int32_t* inputs, const int32_t* targets, int64_t steps, int64_t batch, double clipNorm) {
  const auto start = std::chrono::steady_clock::now();
  LanguageModel& lm = language();
  lm.setTraining(true);
  StepResult result;
  result.samples = steps * batch;
  result.loss = lm.forwardBackward(inputs, targets, steps, batch, true, &result.correct);
  if (!std::isfinite(result.loss))
    throw numericalError("the training loss is " + std::to_string(result.loss) + "; the update was skipped (lower the learning rate)");
  if (clipNorm > 0) {
    // clip_grad_norm_: one norm over every local gradient, all scaled alike.
    double total = 0;
    for (Parameter* p : model_.parameters())
      for (int64_t i = 0; i < p->grad.numel(); ++i) total += static_cast<double>(p->grad.data()[i]) * p->grad.data()[i];
    const double norm = std::sqrt(total);
    if (norm > clipNorm) {
      const float scale = static_cast<float>(clipNorm / (norm + 1e-6));
      for (Parameter* p : model_.parameters())
        for (int64_t i = 0; i < p->grad.numel(); ++i) p->grad.data()[i] *= scale;
    }
  }
  exchangeAndUpdate(result, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return result;
}

StepResult Session::evaluateTokens(const int32_t* inputs, const int32_t* targets, int64_t steps, int64_t batch) {
  LanguageModel& lm = language();
  lm.setTraining(false);
  StepResult result;
  result.samples = steps * batch;
  result.loss = lm.forwardBackward(inputs, targets, steps, batch, false, &result.correct);
  lm.setTraining(true);
  return result;
}

StepResult Session::evaluate(Batcher& batcher) {
  model_.setTraining(false);
  StepResult total;
  double lossSum = 0;
  Batch batch;
  while (batcher.next(batch)) {
    Tensor logits = model_.forward(batch.images);
    int64_t correct = 0;
    lossSum += softmaxCrossEntropy(logits, batch.labels.data(), gradLogits_, &correct) * static_cast<double>(batch.size());
    total.correct += correct;
    total.samples += batch.size();
  }
  model_.setTraining(true);
  total.loss = total.samples ? lossSum / static_cast<double>(total.samples) : 0.0;
  return total;
}

Tensor Session::predict(const float* imagesNchw, int64_t n, int64_t height, int64_t width) {
  Tensor images({n, 3, height, width});
  nchwToNhwc(imagesNchw, images.data(), n, 3, height, width);
  const bool wasTraining = model_.training();
  model_.setTraining(false);
  Tensor logits = model_.forward(images).clone();
  model_.setTraining(wasTraining);
  return logits;
}

void Session::broadcastState(int root) {
  auto& refs = model_.state();
  for (Parameter* p : refs.parameters) group_->broadcast(p->value.data(), p->value.numel(), root);
  for (Buffer* b : refs.buffers) group_->broadcast(b->value.data(), b->value.numel(), root);
}

static StateEntry floatEntry(const std::string& name, const Tensor& t) {
  StateEntry e{name, "F32", t.shape(), std::vector<uint8_t>(t.numel() * sizeof(float))};
  if (t.numel()) std::memcpy(e.bytes.data(), t.data(), e.bytes.size());
  return e;
}

static StateEntry int64Entry(const std::string& name, Shape shape, const int64_t* values) {
  StateEntry e{name, "I64", shape, std::vector<uint8_t>(numelOf(shape) * sizeof(int64_t))};
  std::memcpy(e.bytes.data(), values, e.bytes.size());
  return e;
}

std::vector<StateEntry> Session::state(bool includeTrainer) const {
  auto& refs = const_cast<Model&>(model_).state();
  std::vector<StateEntry> out;
  for (auto [kind, index] : refs.order) {
    if (kind == 0) out.push_back(floatEntry(refs.parameters[index]->name, refs.parameters[index]->value));
    if (kind == 1) out.push_back(floatEntry(refs.buffers[index]->name, refs.buffers[index]->value));
    if (kind == 2) out.push_back(int64Entry(refs.counters[index].name, {}, refs.counters[index].value));
  }
  if (includeTrainer) {
    auto& opt = const_cast<Sgd&>(optimizer_);
    for (size_t k = 0; k < refs.parameters.size(); ++k)
      out.push_back(floatEntry("optimizer.momentum_buffer." + refs.parameters[k]->name, opt.momentumBuffers()[k]));
    const int64_t started = opt.started() ? 1 : 0;
    out.push_back(int64Entry("optimizer.started", {}, &started));
    GradientReducer& reducer = *reducer_;
    if (reducer.compressor() != Compressor::None) {
      std::vector<double> levels(reducer.size());
      for (size_t k = 0; k < reducer.size(); ++k) {
        levels[k] = reducer.level(k);
        const std::string& name = reducer.parameter(k).name;
        if (reducer.errorMemory(k).defined()) out.push_back(floatEntry("compressor.memory." + name, reducer.errorMemory(k)));
        if (reducer.powerSgdQ(k).defined()) out.push_back(floatEntry("compressor.q." + name, reducer.powerSgdQ(k)));
      }
      StateEntry e{"compressor.levels", "F64", {static_cast<int64_t>(levels.size())}, std::vector<uint8_t>(levels.size() * 8)};
      std::memcpy(e.bytes.data(), levels.data(), e.bytes.size());
      out.push_back(std::move(e));
    }
    auto streams = const_cast<Model&>(model_).randomStreams();
    for (size_t i = 0; i < streams.size(); ++i) {
      Random::State s = streams[i]->state();
      out.push_back(int64Entry("rng.dropout." + std::to_string(i), {4}, reinterpret_cast<const int64_t*>(s.words)));
    }
  }
  return out;
}

void Session::loadState(const std::vector<StateEntry>& entries) {
  std::map<std::string, const StateEntry*> byName;
  for (const auto& e : entries) byName[e.name] = &e;
  auto find = [&](const std::string& name, const char* dtype, const Shape& shape, bool required) -> const StateEntry* {
    auto it = byName.find(name);
    if (it == byName.end()) {
      if (required) throw EngineError("ERR_STATE_MISMATCH", "the state has no entry '" + name + "'");
      return nullptr;
    }
    const StateEntry& e = *it->second;
    if (e.dtype != dtype || e.shape != shape)
      throw EngineError("ERR_STATE_MISMATCH", "entry '" + name + "' is " + e.dtype + " " + shapeString(e.shape) +
                                                  " but the model expects " + dtype + " " + shapeString(shape));
    return &e;
  };
  auto& refs = model_.state();
  // Validate everything before changing anything, so a bad state leaves the session untouched.
  std::vector<std::pair<const StateEntry*, void*>> copies;
  for (auto [kind, index] : refs.order) {
    if (kind == 0) copies.emplace_back(find(refs.parameters[index]->name, "F32", refs.parameters[index]->value.shape(), true),
                                       refs.parameters[index]->value.data());
    if (kind == 1) copies.emplace_back(find(refs.buffers[index]->name, "F32", refs.buffers[index]->value.shape(), true),
                                       refs.buffers[index]->value.data());
    if (kind == 2) copies.emplace_back(find(refs.counters[index].name, "I64", {}, true), refs.counters[index].value);
  }
  for (size_t k = 0; k < refs.parameters.size(); ++k) {
    Tensor& buffer = optimizer_.momentumBuffers()[k];
    if (auto e = find("optimizer.momentum_buffer." + refs.parameters[k]->name, "F32", buffer.shape(), false))
      copies.emplace_back(e, buffer.data());
  }
  const StateEntry* started = find("optimizer.started", "I64", {}, false);
  GradientReducer& reducer = *reducer_;
  const StateEntry* levels = reducer.compressor() != Compressor::None
                                 ? find("compressor.levels", "F64", {static_cast<int64_t>(reducer.size())}, false)
                                 : nullptr;
  if (levels) {
    const double* v = reinterpret_cast<const double*>(levels->bytes.data());
    for (size_t k = 0; k < reducer.size(); ++k)
      if (reducer.errorMemory(k).defined()) reducer.checkLevel(v[k], "saved level of '" + reducer.parameter(k).name + "'");
  }
  std::vector<std::pair<const StateEntry*, Random*>> streams;
  auto randomStreams = model_.randomStreams();
  for (size_t i = 0; i < randomStreams.size(); ++i)
    if (auto e = find("rng.dropout." + std::to_string(i), "I64", {4}, false)) streams.emplace_back(e, randomStreams[i]);

  // Levels first: a level change re-draws Q, which the saved Q then overwrites.
  if (levels) {
    const double* v = reinterpret_cast<const double*>(levels->bytes.data());
    for (size_t k = 0; k < reducer.size(); ++k)
      if (reducer.errorMemory(k).defined()) reducer.setLevel(k, v[k]);
  }
  for (size_t k = 0; k < reducer.size(); ++k) {
    const std::string& name = reducer.parameter(k).name;
    if (reducer.errorMemory(k).defined())
      if (auto e = find("compressor.memory." + name, "F32", reducer.errorMemory(k).shape(), false))
        std::memcpy(reducer.errorMemory(k).data(), e->bytes.data(), e->bytes.size());
    if (reducer.powerSgdQ(k).defined())
      if (auto e = find("compressor.q." + name, "F32", reducer.powerSgdQ(k).shape(), false))
        std::memcpy(reducer.powerSgdQ(k).data(), e->bytes.data(), e->bytes.size());
  }
  for (auto [entry, target] : copies) std::memcpy(target, entry->bytes.data(), entry->bytes.size());
  if (started) optimizer_.setStarted(*reinterpret_cast<const int64_t*>(started->bytes.data()) != 0);
  for (auto [entry, stream] : streams) {
    Random::State s;
    std::memcpy(s.words, entry->bytes.data(), sizeof(s.words));
    stream->setState(s);
  }
}

}  // namespace accordion
