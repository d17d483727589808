#include "train/session.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>

#include <omp.h>

namespace accordion {

Session::Session(const ModelSpec& model, const SgdOptions& optimizer, const ReducerOptions& reducer,
                 std::shared_ptr<ProcessGroup> group, const Device& device, int threads, const BackendOptions& backend)
    : backend_(makeBackend(device, backend)),
      model_(model, *backend_),
      optimizer_(model_.parameters(), optimizer, *backend_),
      group_(group ? std::move(group) : std::make_shared<LocalGroup>()) {
  if (!device.isCpu() && group_->size() > 1 && !group_->onDevice())
    throw invalidArgument("a model on " + device.name() + " exchanges gradients over a group of GPU memory (NCCL), not host memory");
  if (reducer.bucketBytes < 0) throw invalidArgument("the bucket size must be ≥ 0 bytes, got " + std::to_string(reducer.bucketBytes));
  reducer_ = std::make_unique<GradientReducer>(model_.parameters(), reducer, *group_, *backend_);
  threads_ = threads > 0 ? threads : omp_get_max_threads();
  // Overlap needs another worker to exchange with, a backward that finishes layer by layer (the
  // language model's gradients are all final at once, after clipping) and the CPU's threads.
  if (reducer.bucketBytes > 0 && group_->size() > 1 && device.isCpu() && !model_.language()) {
    auto& params = model_.parameters();
    for (size_t i = 0; i < params.size(); ++i) parameterIndex_[params[i]] = i;
    exchange_ = std::make_unique<BucketExchange>(*reducer_, params, reducer.bucketBytes);
    backwardHook_ = [this](Module& module) { backwardFinished(module); };
    model_.setBackwardHook(&backwardHook_);
  }
  omp_set_num_threads(threads_);  // this thread's: sessions are built on the thread that runs them
}

Session::~Session() {
  if (exchange_) model_.setBackwardHook(nullptr);
}

int Session::computeThreads() const { return exchange_ ? std::max(1, threads_ - 1) : threads_; }

void Session::backwardFinished(Module& module) {
  if (!overlapping_) return;
  auto it = moduleParameters_.find(&module);
  if (it == moduleParameters_.end()) {
    std::vector<Parameter*> parameters;
    module.addParameters(parameters);
    std::vector<size_t> indices;
    for (const Parameter* p : parameters) indices.push_back(parameterIndex_.at(p));
    it = moduleParameters_.emplace(&module, std::move(indices)).first;
  }
  for (size_t i : it->second) exchange_->ready(i);
}

std::pair<Tensor, Array<int32_t>> Session::onDevice(Batch& batch) {
  if (batch.channelsLast != backend_->channelsLast())
    throw invalidArgument(std::string("the batcher prepares ") + (batch.channelsLast ? "channels-last" : "channels-first") +
                          " batches but the model runs on " + backend_->device().name() + "; create the Batcher with device '" +
                          backend_->device().name() + "'");
  if (batch.images.device() == backend_->device()) return {batch.images, batch.labels};
  if (batch.stagedBy != backend_.get()) {
    batch.deviceImages = Tensor::wrap(batch.images.shape(), backend_->device(),
                                      backend_->uploadAhead(batch.images.data(), batch.images.bytes(), batch.images.storage()));
    batch.deviceLabels = Array<int32_t>::wrap(batch.labels.size(), backend_->device(),
                                              backend_->uploadAhead(batch.labels.data(), batch.labels.bytes(), batch.labels.storage()));
    batch.stagedBy = backend_.get();
  }
  return {batch.deviceImages, batch.deviceLabels};
}

void Session::stageFollowing(Batcher& batcher) {
  if (backend_->device().isCpu()) return;  // batches are assembled in host memory already
  batcher.withNext([this](Batch& following) {
    if (following.channelsLast == backend_->channelsLast()) onDevice(following);
  });
}

void Session::forwardLoss(Batch& batch, double* status) {
  auto [images, labels] = onDevice(batch);
  Tensor logits = model_.forward(images);
  ensureShape(gradLogits_, logits.shape(), *backend_);
  backend_->softmaxCrossEntropy(logits.data(), labels.data(), logits.dim(0), logits.dim(1), gradLogits_.data(), status);
}

std::vector<double> Session::readStatus(int64_t count) {
  std::vector<double> host(count);
  backend_->download(host.data(), status_.data(), count * sizeof(double));
  backend_->synchronize();
  return host;
}

std::optional<StepResult> Session::trainStep(Batcher& batcher, int64_t microBatches) {
  return step([&batcher](Batch& batch) { return batcher.next(batch); }, [this, &batcher] { stageFollowing(batcher); },
              microBatches);
}

StepResult Session::trainStep(const float* imagesNchw, const int32_t* labels, int64_t n, int64_t height, int64_t width) {
  if (n < 1 || height < 1 || width < 1) throw invalidArgument("a step needs at least one image of at least 1×1 pixels");
  const int64_t classes = model_.spec().classes;
  for (int64_t i = 0; i < n; ++i)
    if (labels[i] < 0 || labels[i] >= classes)
      throw invalidArgument("label " + std::to_string(labels[i]) + " at index " + std::to_string(i) + " is outside [0, " +
                            std::to_string(classes) + ")");
  // The caller's tensors as a batch in the backend's layout and memory, then the Batcher path's step.
  Batch batch;
  batch.channelsLast = backend_->channelsLast();
  batch.images = backend_->empty({n, 3, height, width});
  backend_->uploadImages(imagesNchw, batch.images.data(), n, 3, height, width);
  batch.labels = Array<int32_t>(n, *backend_);
  backend_->upload(batch.labels.data(), labels, n * sizeof(int32_t));
  bool given = false;
  std::optional<StepResult> result = step(
      [&](Batch& out) {
        if (given) return false;
        out = batch;
        given = true;
        return true;
      },
      [] {}, 1);
  return *result;
}

std::optional<StepResult> Session::step(const std::function<bool(Batch&)>& next, const std::function<void()>& afterBackward,
                                        int64_t microBatches) {
  if (microBatches < 1) throw invalidArgument("a step needs at least one micro-batch, got " + std::to_string(microBatches));
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  model_.setTraining(true);
  auto& params = model_.parameters();
  ensureSize(status_, 2 * microBatches + 1, *backend_);
  // The exchange overlaps a single batch's backward; kept gradients are copied before it starts.
  const bool overlapped = exchange_ && microBatches == 1 && !keepGradients_;
  omp_set_num_threads(overlapped ? computeThreads() : threads_);
  std::vector<int64_t> sizes;
  Batch batch;
  int64_t bufferFloats = 0;
  double broadcastSeconds = 0;
  while (static_cast<int64_t>(sizes.size()) < microBatches && next(batch)) {
    const int64_t taken = static_cast<int64_t>(sizes.size());
    if (taken == 0 && broadcastBuffers_) {  // rank 0's running statistics before the step's first forward
      const auto broadcastStart = Clock::now();
      bufferFloats = broadcastBuffers(0);
      broadcastSeconds = std::chrono::duration<double>(Clock::now() - broadcastStart).count();
    }
    forwardLoss(batch, status_.data() + 2 * taken);
    if (overlapped) {
      exchange_->begin();
      overlapping_ = true;
      try {
        model_.backward(gradLogits_);
      } catch (...) {
        overlapping_ = false;
        exchange_->abandon();
        throw;
      }
      overlapping_ = false;
    } else {
      model_.backward(gradLogits_);
    }
    afterBackward();
    sizes.push_back(batch.size());
    if (microBatches == 1) break;
    // A large batch from micro-batches: sum their mean gradients, averaged below.
    if (accumulated_.size() != params.size()) {
      accumulated_.clear();
      for (Parameter* p : params) accumulated_.push_back(backend_->empty(p->grad.shape()));
    }
    for (size_t k = 0; k < params.size(); ++k) {
      if (taken == 0)
        backend_->copy(accumulated_[k].data(), params[k]->grad.data(), params[k]->grad.bytes());
      else
        backend_->addInPlace(accumulated_[k].data(), params[k]->grad.data(), params[k]->grad.numel());
    }
  }
  const int64_t taken = static_cast<int64_t>(sizes.size());
  if (taken == 0) return std::nullopt;
  if (microBatches > 1) {
    const float inv = 1.0f / static_cast<float>(taken);
    for (size_t k = 0; k < params.size(); ++k)
      backend_->scale(accumulated_[k].data(), params[k]->grad.data(), params[k]->grad.numel(), inv);
  }
  // The step's one wait for the device: the losses, and whether every gradient is finite (the
  // overlapped exchange checks each bucket's gradients itself).
  if (!overlapped) reducer_->checkFinite(status_.data() + 2 * taken);
  const std::vector<double> status = readStatus(2 * taken + (overlapped ? 0 : 1));
  StepResult result;
  double lossSum = 0;
  for (int64_t i = 0; i < taken; ++i) {
    const double loss = status[2 * i];
    if (!std::isfinite(loss)) {
      if (overlapped) exchange_->abandon();
      throw numericalError("the training loss is " + std::to_string(loss) +
                           "; the update was skipped (lower the learning rate or check the data)");
    }
    lossSum += loss * static_cast<double>(sizes[i]);
    result.correct += static_cast<int64_t>(status[2 * i + 1]);
    result.samples += sizes[i];
  }
  result.loss = lossSum / static_cast<double>(result.samples);
  exchangeAndUpdate(result, std::chrono::duration<double>(Clock::now() - start).count() - broadcastSeconds,
                    overlapped ? 0 : static_cast<int64_t>(status[2 * taken]), overlapped);
  result.overheadFloats += bufferFloats;
  result.broadcastFloats = bufferFloats;
  result.communicationSeconds += broadcastSeconds;
  return result;
}

void Session::exchangeAndUpdate(StepResult& result, double computeSecondsSoFar, int64_t firstBad, bool overlapped) {
  using Clock = std::chrono::steady_clock;
  if (keepGradients_) {
    auto& params = model_.parameters();
    localGradients_.resize(params.size());
    for (size_t k = 0; k < params.size(); ++k) {
      ensureShape(localGradients_[k], params[k]->grad.shape(), *backend_);
      backend_->copy(localGradients_[k].data(), params[k]->grad.data(), params[k]->grad.bytes());
    }
  }
  const auto reduceStart = Clock::now();
  const ReduceResult reduced = overlapped ? exchange_->finish() : reducer_->reduce(firstBad);
  const auto reduceEnd = Clock::now();
  optimizer_.step();
  result.floatsSent = reduced.floatsSent;
  result.overheadFloats = reduced.overheadFloats;
  result.communicationSeconds = reduced.communicationSeconds;
  result.exchangeWaitSeconds = std::chrono::duration<double>(reduceEnd - reduceStart).count();
  // Overlapped, the exchange thread's own time is the compression and communication.
  result.compressionSeconds = (overlapped ? exchange_->busySeconds() : result.exchangeWaitSeconds) - reduced.communicationSeconds;
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
    std::vector<ConstSpan> grads;
    for (Parameter* p : model_.parameters()) grads.push_back({p->grad.data(), p->grad.numel()});
    const double norm = std::sqrt(backend_->totalSumOfSquares(grads));
    if (norm > clipNorm) {
      const float scale = static_cast<float>(clipNorm / (norm + 1e-6));
      for (Parameter* p : model_.parameters()) backend_->scale(p->grad.data(), p->grad.data(), p->grad.numel(), scale);
    }
  }
  exchangeAndUpdate(result, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(),
                    reducer_->firstNonFinite());
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
  ensureSize(status_, 2 * batcher.batchesPerEpoch(), *backend_);
  std::vector<int64_t> sizes;
  Batch batch;
  while (batcher.next(batch)) {
    forwardLoss(batch, status_.data() + 2 * sizes.size());
    stageFollowing(batcher);
    sizes.push_back(batch.size());
  }
  model_.setTraining(true);
  const std::vector<double> status = readStatus(2 * static_cast<int64_t>(sizes.size()));
  StepResult total;
  double lossSum = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    lossSum += status[2 * i] * static_cast<double>(sizes[i]);
    total.correct += static_cast<int64_t>(status[2 * i + 1]);
    total.samples += sizes[i];
  }
  total.loss = total.samples ? lossSum / static_cast<double>(total.samples) : 0.0;
  return total;
}

Tensor Session::predict(const float* imagesNchw, int64_t n, int64_t height, int64_t width) {
  return forward(imagesNchw, n, height, width, false);
}

Tensor Session::forward(const float* imagesNchw, int64_t n, int64_t height, int64_t width, bool training) {
  Tensor images = backend_->empty({n, 3, height, width});
  backend_->uploadImages(imagesNchw, images.data(), n, 3, height, width);
  const bool wasTraining = model_.training();
  model_.setTraining(training);
  Tensor logits = backend_->toHost(model_.forward(images));
  model_.setTraining(wasTraining);
  return logits;
}

Tensor Session::forwardTokens(const int32_t* inputs, int64_t steps, int64_t batch, bool training) {
  LanguageModel& lm = language();
  const std::vector<int32_t> noTargets(static_cast<size_t>(steps * batch), 0);  // the loss is computed, not used
  const bool wasTraining = lm.training();
  lm.setTraining(training);
  int64_t correct = 0;
  lm.forwardBackward(inputs, noTargets.data(), steps, batch, false, &correct);
  lm.setTraining(wasTraining);
  return backend_->toHost(lm.logits());
}

void Session::keepGradients(bool keep) {
  keepGradients_ = keep;
  if (!keep) localGradients_.clear();
}

std::vector<StateEntry> Session::localGradients() {
  std::vector<StateEntry> out;
  auto& params = model_.parameters();
  if (localGradients_.size() != params.size()) return out;
  for (size_t k = 0; k < params.size(); ++k) {
    const Tensor& g = localGradients_[k];
    StateEntry e{params[k]->name, "F32", g.shape(), std::vector<uint8_t>(g.bytes())};
    backend_->download(e.bytes.data(), g.data(), g.bytes());
    out.push_back(std::move(e));
  }
  backend_->synchronize();
  return out;
}

void Session::broadcastState(int root) {
  auto& refs = model_.state();
  if (group_->onDevice()) backend_->synchronize();  // the group's collectives run after the model's work
  for (Parameter* p : refs.parameters) group_->broadcast(p->value.data(), p->value.numel(), root);
  broadcastBuffers(root);
}

int64_t Session::broadcastBuffers(int root) {
  const std::vector<Buffer*>& buffers = model_.state().buffers;
  if (buffers.empty() || group_->size() < 2) return 0;
  int64_t total = 0;
  for (const Buffer* b : buffers) total += b->value.numel();
  ensureShape(bufferPack_, {total}, *backend_);
  int64_t offset = 0;
  for (const Buffer* b : buffers) {
    backend_->copy(bufferPack_.data() + offset, b->value.data(), b->value.bytes());
    offset += b->value.numel();
  }
  if (group_->onDevice()) backend_->synchronize();  // the group's collectives run after the model's work
  group_->broadcast(bufferPack_.data(), total, root);
  offset = 0;
  for (Buffer* b : buffers) {
    backend_->copy(b->value.data(), bufferPack_.data() + offset, b->value.bytes());
    offset += b->value.numel();
  }
  return total;
}

// FNV-1a over 64-bit words (the tail bytes zero-padded), then a final avalanche: not cryptographic,
// but any changed bit changes the digest with overwhelming probability.
static uint64_t digestOf(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xcbf29ce484222325ull ^ bytes.size();
  const size_t words = bytes.size() / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, bytes.data() + 8 * i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, bytes.data() + 8 * words, bytes.size() - 8 * words);
  h = (h ^ tail) * 0x100000001b3ull;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  return h;
}

std::vector<std::pair<std::string, uint64_t>> Session::stateDigests() {
  std::vector<std::pair<std::string, uint64_t>> out;
  for (const StateEntry& e : state(false)) out.emplace_back(e.name, digestOf(e.bytes));
  return out;
}

static StateEntry int64Entry(const std::string& name, Shape shape, const int64_t* values) {
  StateEntry e{name, "I64", shape, std::vector<uint8_t>(numelOf(shape) * sizeof(int64_t))};
  std::memcpy(e.bytes.data(), values, e.bytes.size());
  return e;
}

std::vector<StateEntry> Session::state(bool includeTrainer) {
  auto& refs = model_.state();
  // Tensors live on the backend's device: each is downloaded into its entry, all read after one wait.
  auto floatEntry = [this](const std::string& name, const Tensor& t) {
    StateEntry e{name, "F32", t.shape(), std::vector<uint8_t>(t.bytes())};
    backend_->download(e.bytes.data(), t.data(), t.bytes());
    return e;
  };
  std::vector<StateEntry> out;
  for (auto [kind, index] : refs.order) {
    if (kind == 0) out.push_back(floatEntry(refs.parameters[index]->name, refs.parameters[index]->value));
    if (kind == 1) out.push_back(floatEntry(refs.buffers[index]->name, refs.buffers[index]->value));
    if (kind == 2) out.push_back(int64Entry(refs.counters[index].name, {}, refs.counters[index].value));
  }
  if (includeTrainer) {
    Sgd& opt = optimizer_;
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
    auto streams = model_.randomStreams();
    for (size_t i = 0; i < streams.size(); ++i) {
      Random::State s = streams[i]->state();
      out.push_back(int64Entry("rng.dropout." + std::to_string(i), {4}, reinterpret_cast<const int64_t*>(s.words)));
    }
  }
  backend_->synchronize();
  return out;
}

void Session::loadState(const std::vector<StateEntry>& entries) {
  std::map<std::string, const StateEntry*> byName;
  for (const auto& e : entries) {
    if (byName.count(e.name)) throw EngineError("ERR_STATE_MISMATCH", "the state has two entries named '" + e.name + "'");
    byName[e.name] = &e;
  }
  std::vector<std::string> missing;
  std::map<std::string, bool> known;  // every name the model or its trainer reads
  auto find = [&](const std::string& name, const char* dtype, const Shape& shape, bool required) -> const StateEntry* {
    known[name] = true;
    auto it = byName.find(name);
    if (it == byName.end()) {
      if (required) missing.push_back(name);
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
  // Tensors are uploaded to the backend's device; counters live on the host.
  std::vector<std::pair<const StateEntry*, void*>> copies, hostCopies;
  for (auto [kind, index] : refs.order) {
    if (kind == 0) copies.emplace_back(find(refs.parameters[index]->name, "F32", refs.parameters[index]->value.shape(), true),
                                       refs.parameters[index]->value.data());
    if (kind == 1) copies.emplace_back(find(refs.buffers[index]->name, "F32", refs.buffers[index]->value.shape(), true),
                                       refs.buffers[index]->value.data());
    if (kind == 2) hostCopies.emplace_back(find(refs.counters[index].name, "I64", {}, true), refs.counters[index].value);
  }
  auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (size_t i = 0; i < names.size(); ++i) out += (i ? ", '" : "'") + names[i] + "'";
    return out;
  };
  if (!missing.empty())
    throw EngineError("ERR_STATE_MISMATCH", std::string(missing.size() == 1 ? "the state has no entry " : "the state has no entries ") +
                                                list(missing));
  // Unknown model entries are refused (strict, as PyTorch's load_state_dict). Trainer entries of
  // another configuration (another compressor, no momentum) are not the model's and are skipped.
  // The language model's decoder.weight (PyTorch's state_dict lists the tied weight twice) must
  // equal encoder.weight: an untied model cannot load into this one.
  std::vector<std::string> unknown;
  for (const auto& [name, e] : byName) {
    if (known.count(name)) continue;
    if (name.rfind("optimizer.", 0) == 0 || name.rfind("compressor.", 0) == 0 || name.rfind("rng.", 0) == 0) continue;
    if (name == "decoder.weight" && model_.language() && byName.count("encoder.weight")) {
      const StateEntry& encoder = *byName.at("encoder.weight");
      if (e->dtype != encoder.dtype || e->shape != encoder.shape || e->bytes != encoder.bytes)
        throw EngineError("ERR_STATE_MISMATCH",
                          "entry 'decoder.weight' differs from 'encoder.weight': this language model ties its decoder to its "
                          "embedding and cannot load an untied model's weights");
      continue;
    }
    unknown.push_back(name);
  }
  if (!unknown.empty())
    throw EngineError("ERR_STATE_MISMATCH", std::string(unknown.size() == 1 ? "the state has an unknown entry " : "the state has unknown entries ") +
                                                list(unknown) + " (not in this " + model_.spec().architecture + "'s state_dict)");
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
        backend_->upload(reducer.errorMemory(k).data(), e->bytes.data(), e->bytes.size());
    if (reducer.powerSgdQ(k).defined())
      if (auto e = find("compressor.q." + name, "F32", reducer.powerSgdQ(k).shape(), false))
        backend_->upload(reducer.powerSgdQ(k).data(), e->bytes.data(), e->bytes.size());
  }
  for (auto [entry, target] : copies) backend_->upload(target, entry->bytes.data(), entry->bytes.size());
  for (auto [entry, target] : hostCopies) std::memcpy(target, entry->bytes.data(), entry->bytes.size());
  if (started) optimizer_.setStarted(*reinterpret_cast<const int64_t*>(started->bytes.data()) != 0);
  for (auto [entry, stream] : streams) {
    Random::State s;
    std::memcpy(s.words, entry->bytes.data(), sizeof(s.words));
    stream->setState(s);
  }
}

}  // namespace accordion
