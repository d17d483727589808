// The session's steps: training over a batcher or the caller's batches, evaluation and forward.
#include "train/session.h"

#include <chrono>
#include <cmath>

#include <omp.h>

#include "compress/staged_group.h"

namespace accordion {

namespace {

// A step's forward and backward (or an evaluation) as the backend's cast scope: the parameters hold
// still within it.
struct CastScope {
  explicit CastScope(Backend& backend) : backend(backend) { backend.beginCastScope(); }
  ~CastScope() { backend.endCastScope(); }
  Backend& backend;
};

}  // namespace

Session::Session(const ModelSpec& model, const SgdOptions& optimizer, const ReducerOptions& reducer,
                 std::shared_ptr<ProcessGroup> group, const Device& device, int threads, const BackendOptions& backend)
    : backend_(makeBackend(device, backend)),
      model_(model, *backend_),
      optimizer_(model_.parameters(), optimizer, *backend_),
      group_(group ? std::move(group) : std::make_shared<LocalGroup>()) {
  if (!device.isCpu() && group_->size() > 1 && !group_->onDevice()) {
    hostGroup_ = std::move(group_);
    group_ = std::make_shared<StagedGroup>(*hostGroup_, *backend_);
  }
  std::vector<ConstSpan> values;
  for (const Parameter* p : model_.parameters()) values.push_back({p->value.data(), p->value.numel()});
  backend_->setParameters(std::move(values));
  if (reducer.bucketBytes < 0) throw invalidArgument("the bucket size must be ≥ 0 bytes, got " + std::to_string(reducer.bucketBytes));
  reducer_ = std::make_unique<GradientReducer>(model_.parameters(), reducer, *group_, *backend_);
  threads_ = threads > 0 ? threads : omp_get_max_threads();
  // Overlap needs another worker to exchange with and the CPU's threads.
  if (reducer.bucketBytes > 0 && group_->size() > 1 && device.isCpu()) {
    auto& params = model_.parameters();
    for (size_t i = 0; i < params.size(); ++i) parameterIndex_[params[i]] = i;
    exchange_ = std::make_unique<BucketExchange>(*reducer_, params, reducer.bucketBytes);
    model_.setGradientsReady([this](const std::vector<Parameter*>& finished) {
      if (!overlapping_) return;
      for (const Parameter* p : finished) exchange_->ready(parameterIndex_.at(p));
    });
  }
  omp_set_num_threads(threads_);  // this thread's: sessions are built on the thread that runs them
}

Session::~Session() {
  if (exchange_) model_.setGradientsReady(nullptr);
}

int Session::computeThreads() const { return exchange_ ? std::max(1, threads_ - 1) : threads_; }

void Session::setClipNorm(double norm) {
  if (!(norm >= 0 && std::isfinite(norm))) throw invalidArgument("the gradient-norm clip must be a finite number ≥ 0, got " + std::to_string(norm));
  clipNorm_ = norm;
}

Batch Session::fromHost(const HostBatch& in) {
  const bool tokens = in.tokens != nullptr;
  const int64_t n = tokens ? in.steps * in.columns : in.count;
  if (tokens ? in.steps < 1 || in.columns < 1 : in.count < 1 || in.height < 1 || in.width < 1)
    throw invalidArgument(tokens ? "a token window needs at least one step and one column"
                                 : "a batch needs at least one image of at least 1×1 pixels");
  const int64_t classes = model_.spec().classes;
  std::vector<int32_t> zeros;
  const int32_t* labels = in.labels;
  if (!labels) {
    zeros.assign(static_cast<size_t>(n), 0);  // forward only: the loss is computed, not used
    labels = zeros.data();
  }
  for (int64_t i = 0; i < n; ++i)
    if (labels[i] < 0 || labels[i] >= classes)
      throw invalidArgument(std::string(tokens ? "target " : "label ") + std::to_string(labels[i]) + " at index " + std::to_string(i) +
                            " is outside [0, " + std::to_string(classes) + ")");
  Batch batch;
  batch.channelsLast = backend_->channelsLast();
  if (tokens) {
    batch.tokens = in.tokens;
    batch.steps = in.steps;
  } else {
    batch.images = backend_->empty({n, 3, in.height, in.width});
    backend_->uploadImages(in.images, batch.images.data(), n, 3, in.height, in.width);
  }
  batch.labels = Array<int32_t>(n, *backend_);
  backend_->upload(batch.labels.data(), labels, n * sizeof(int32_t));
  return batch;
}

ModelInput Session::onDevice(Batch& batch) {
  if (batch.tokens) return {Tensor(), batch.tokens, batch.steps, batch.size() / batch.steps, batch.labels};
  // A GPU batcher's channels-first batch for a channels-last GPU model is converted on the device.
  const bool convert = !batch.channelsLast && backend_->channelsLast() && !backend_->device().isCpu();
  if (batch.channelsLast != backend_->channelsLast() && !convert)
    throw invalidArgument(std::string("the batcher prepares ") + (batch.channelsLast ? "channels-last" : "channels-first") +
                          " batches but the model runs on " + backend_->device().name() + "; create the Batcher with device '" +
                          backend_->device().name() + "'");
  if (batch.images.device() == backend_->device()) return {batch.images, nullptr, 0, 0, batch.labels};
  if (batch.stagedBy != backend_.get()) {
    batch.deviceImages = Tensor::wrap(batch.images.shape(), backend_->device(),
                                      backend_->uploadAhead(batch.images.data(), batch.images.bytes(), batch.images.storage()));
    if (convert) {  // (N, C·H·W) in channel-major order into the activation layout: flattenBackward's conversion
      const Shape& s = batch.images.shape();
      Tensor images = backend_->empty(s);
      backend_->flattenBackward(batch.deviceImages.data(), images.data(), s[0], s[1], s[2], s[3]);
      batch.deviceImages = std::move(images);
    }
    batch.deviceLabels = Array<int32_t>::wrap(batch.labels.size(), backend_->device(),
                                              backend_->uploadAhead(batch.labels.data(), batch.labels.bytes(), batch.labels.storage()));
    batch.stagedBy = backend_.get();
  }
  return {batch.deviceImages, nullptr, 0, 0, batch.deviceLabels};
}

void Session::stageFollowing(Batcher& batcher) {
  if (backend_->device().isCpu()) return;  // batches are assembled in host memory already
  batcher.withNext([this](Batch& following) {
    if (following.channelsLast == backend_->channelsLast() || !following.channelsLast) onDevice(following);
  });
}

std::vector<double> Session::readStatus(int64_t count) {
  std::vector<double> host(count);
  backend_->download(host.data(), status_.data(), count * sizeof(double));
  backend_->synchronize();
  return host;
}

// Yields the batches of `batches` in turn.
static std::function<bool(Batch&)> yieldEach(std::vector<Batch>& batches) {
  return [&batches, next = size_t{0}](Batch& out) mutable {
    if (next == batches.size()) return false;
    out = batches[next++];
    return true;
  };
}

std::optional<StepResult> Session::trainStep(Batcher& batcher, int64_t microBatches) {
  return step([&batcher](Batch& batch) { return batcher.next(batch); }, [this, &batcher] { stageFollowing(batcher); },
              microBatches);
}

StepResult Session::trainStep(const std::vector<HostBatch>& microBatches) {
  if (microBatches.empty()) throw invalidArgument("a step needs at least one batch");
  std::vector<Batch> batches;
  for (const HostBatch& b : microBatches) batches.push_back(fromHost(b));
  return *step(yieldEach(batches), [] {}, static_cast<int64_t>(batches.size()));
}

std::optional<StepResult> Session::step(const std::function<bool(Batch&)>& next, const std::function<void()>& afterBackward,
                                        int64_t microBatches) {
  if (microBatches < 1) throw invalidArgument("a step needs at least one micro-batch, got " + std::to_string(microBatches));
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const CastScope scope(*backend_);
  model_.setTraining(true);
  auto& params = model_.parameters();
  ensureSize(status_, 2 * microBatches + 1, *backend_);
  // The exchange overlaps a single batch's backward with final gradients: not clipped, and not kept
  // (kept gradients are copied before the exchange starts).
  const bool overlapped = exchange_ && microBatches == 1 && !keepGradients_ && clipNorm_ == 0;
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
    model_.forwardLoss(onDevice(batch), status_.data() + 2 * taken);
    if (overlapped) {
      exchange_->begin();
      overlapping_ = true;
      try {
        model_.backward();
      } catch (...) {
        overlapping_ = false;
        exchange_->abandon();
        throw;
      }
      overlapping_ = false;
    } else {
      model_.backward();
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
  if (clipNorm_ > 0) clipGradients();
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

void Session::clipGradients() {
  // clip_grad_norm_: one norm over every local gradient, all scaled alike, on the device.
  std::vector<Span> grads;
  for (Parameter* p : model_.parameters()) grads.push_back({p->grad.data(), p->grad.numel()});
  backend_->clipTotalNorm(grads, clipNorm_);
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
  result.bytesSent = reduced.bytesSent;
  result.overheadFloats = reduced.overheadFloats;
  result.communicationSeconds = reduced.communicationSeconds;
  result.collectives = reduced.collectives;
  result.exchangeWaitSeconds = std::chrono::duration<double>(reduceEnd - reduceStart).count();
  // Overlapped, the exchange thread's own time is the compression and communication.
  result.compressionSeconds = (overlapped ? exchange_->busySeconds() : result.exchangeWaitSeconds) - reduced.communicationSeconds;
  result.computeSeconds = computeSecondsSoFar + std::chrono::duration<double>(Clock::now() - reduceEnd).count();
}

StepResult Session::evaluate(Batcher& batcher) {
  return evaluate([&batcher](Batch& batch) { return batcher.next(batch); }, [this, &batcher] { stageFollowing(batcher); },
                  batcher.batchesPerEpoch());
}

StepResult Session::evaluate(const HostBatch& in) {
  std::vector<Batch> batches{fromHost(in)};
  return evaluate(yieldEach(batches), [] {}, 1);
}

StepResult Session::evaluate(const std::function<bool(Batch&)>& next, const std::function<void()>& afterForward, int64_t capacity) {
  const CastScope scope(*backend_);
  model_.setTraining(false);
  ensureSize(status_, 2 * std::max<int64_t>(capacity, 1), *backend_);
  std::vector<int64_t> sizes;
  Batch batch;
  try {
    while (static_cast<int64_t>(sizes.size()) < capacity && next(batch)) {
      model_.forwardLoss(onDevice(batch), status_.data() + 2 * sizes.size());
      afterForward();
      sizes.push_back(batch.size());
    }
  } catch (...) {
    model_.setTraining(true);
    throw;
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

Tensor Session::forward(const HostBatch& in, bool training) {
  Batch batch = fromHost(in);
  const bool wasTraining = model_.training();
  const CastScope scope(*backend_);
  model_.setTraining(training);
  ensureSize(status_, 2, *backend_);
  try {
    model_.forwardLoss(onDevice(batch), status_.data());
  } catch (...) {
    model_.setTraining(wasTraining);
    throw;
  }
  model_.setTraining(wasTraining);
  return backend_->toHost(model_.logits());
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

}  // namespace accordion
