#include "compress/reducer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace accordion {

Compressor parseCompressor(const std::string& name) {
  if (name == "none") return Compressor::None;
  if (name == "powersgd") return Compressor::PowerSgd;
  if (name == "topk") return Compressor::TopK;
  throw invalidArgument("unknown compressor '" + name + "' (known: none, powersgd, topk)");
}

const char* compressorName(Compressor c) {
  switch (c) {
    case Compressor::PowerSgd: return "powersgd";
    case Compressor::TopK: return "topk";
    default: return "none";
  }
}

static uint64_t mix(uint64_t a, uint64_t b) { return finalise(a * kGolden + b + 0x2545F4914F6CDD1Dull); }

GradientReducer::GradientReducer(std::vector<Parameter*> parameters, const ReducerOptions& options, ProcessGroup& group,
                                 Backend& backend)
    : options_(options), group_(group), backend_(backend), kernels_(backend.compression()), finiteFlag_(1, backend) {
  if (options.compressor != Compressor::None) checkLevel(options.level, "initial level", false);
  for (Parameter* p : parameters) {
    Slot s;
    s.parameter = p;
    const Shape& shape = p->value.shape();
    s.matrix = shape.size() > 1;
    s.rows = shape.empty() ? 1 : shape[0];
    s.cols = s.rows ? p->value.numel() / s.rows : 0;
    if (s.matrix && options.compressor != Compressor::None) {
      s.level = options.level;
      s.memory = backend.zeros(shape);
    }
    if (options.accumulateNorms) s.normSum = backend.zeros(shape);
    slots_.push_back(std::move(s));
  }
  for (size_t i = 0; i < slots_.size(); ++i)
    if (options_.compressor == Compressor::PowerSgd && slots_[i].matrix) drawQ(i);
}

void GradientReducer::checkLevel(double level, const std::string& where, bool allowDense) const {
  if (allowDense && level == 0 && options_.compressor != Compressor::None) return;
  if (options_.compressor == Compressor::PowerSgd) {
    if (!std::isfinite(level) || level < 1 || level != std::floor(level))
      throw invalidArgument(where + ": a PowerSGD rank must be a positive integer (or 0: dense), got " + std::to_string(level));
  } else if (options_.compressor == Compressor::TopK) {
    if (!(level > 0 && level <= 1))
      throw invalidArgument(where + ": a TopK ratio must lie in (0, 1] (or be 0: dense), got " + std::to_string(level));
  } else {
    throw invalidArgument(where + ": no compressor is active, so there are no levels to set");
  }
}

void GradientReducer::setLevel(size_t index, double level) {
  Slot& s = slots_.at(index);
  const std::string where = "level of '" + s.parameter->name + "'";
  checkLevel(level, where);
  if (!s.matrix) throw invalidArgument(where + ": the parameter is 1-D and always sent dense");
  if (level == s.level) return;  // keeps PowerSGD's warm-started Q
  s.level = level;
  if (level == 0)
    s.flushMemory = true;  // Q stays as it was, unused until the next compressed level re-draws it
  else if (options_.compressor == Compressor::PowerSgd)
    drawQ(index);
}

int64_t GradientReducer::rankAt(const Slot& s, double level) const {
  return std::min<int64_t>({s.rows, s.cols, static_cast<int64_t>(level)});
}

bool GradientReducer::compressedAt(const Slot& s, double level) const {
  if (!s.matrix || options_.compressor == Compressor::None || level == 0) return false;
  if (options_.compressor == Compressor::TopK) return true;
  const double r = static_cast<double>(rankAt(s, level));
  return options_.minCompressionRate <= 0 ||
         (static_cast<double>(s.rows + s.cols) * r * options_.minCompressionRate < static_cast<double>(s.rows * s.cols));
}

bool GradientReducer::isCompressed(size_t index) const { return compressed(slots_.at(index)); }

// Q is drawn on the host from the shared seed, so every worker and every device starts alike.
void GradientReducer::drawQ(size_t index) { slots_[index].q = initialQ(index, rankOf(slots_[index])); }

Tensor GradientReducer::initialQ(size_t index, int64_t rank) const {
  Tensor q({slots_[index].cols, rank});
  Random rng(mix(options_.seed, index));
  for (int64_t i = 0; i < q.numel(); ++i) q.data()[i] = rng.normal();
  return backend_.toDevice(q);
}

static int64_t topKCount(double ratio, int64_t numel) {
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(ratio * static_cast<double>(numel))));
}

int64_t GradientReducer::floatsPerStep() const {
  int64_t total = 0;
  for (const Slot& s : slots_) {
    const int64_t numel = s.parameter->value.numel();
    if (!compressed(s))
      total += numel;
    else if (options_.compressor == Compressor::PowerSgd)
      total += (s.rows + s.cols) * rankOf(s);
    else
      total += 2 * topKCount(s.level, numel) * group_.size();
  }
  return total;
}

void GradientReducer::checkFinite(double* firstBad) {
  std::vector<ConstSpan> grads;
  for (const Slot& s : slots_) grads.push_back({s.parameter->grad.data(), s.parameter->grad.numel()});
  backend_.findNonFinite(grads, firstBad);
}

int64_t GradientReducer::firstNonFinite() {
  checkFinite(finiteFlag_.data());
  double firstBad = 0;
  backend_.download(&firstBad, finiteFlag_.data(), sizeof(double));
  backend_.synchronize();
  return static_cast<int64_t>(firstBad);
}

ReduceResult GradientReducer::reduce(int64_t firstBad) {
  communicationSeconds_ = 0;
  ReduceResult result;
  agree(firstBad, result);
  std::vector<size_t> all(slots_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  exchange(all, result);
  result.communicationSeconds = communicationSeconds_;
  return result;
}

void GradientReducer::agree(int64_t firstBad, ReduceResult& result) {
  // Workers agree before any memory, sum or weight changes, so a NaN on one worker stops the step
  // on all of them instead of leaving the others in a collective. Each publishes its result in its
  // own slot.
  std::vector<float> badIndex(group_.size(), 0.0f);
  badIndex[group_.rank()] = static_cast<float>(firstBad);
  if (group_.size() > 1) {
    result.overheadFloats = group_.size();
    if (group_.onDevice()) {
      float* flags = scratch(agreementBuffer_, group_.size());
      backend_.upload(flags, badIndex.data(), badIndex.size() * sizeof(float));
      communicate([&] { group_.allReduceSum(flags, group_.size()); });
      backend_.download(badIndex.data(), flags, badIndex.size() * sizeof(float));
      backend_.synchronize();
    } else {
      communicate([&] { group_.allReduceSum(badIndex.data(), group_.size()); });
    }
  }
  for (int r = 0; r < group_.size(); ++r)
    if (badIndex[r] > 0)
      throw numericalError("the gradient of '" + slots_[static_cast<size_t>(badIndex[r]) - 1].parameter->name +
                           "' contains NaN or Inf on rank " + std::to_string(r) + "; the step was skipped on every worker");
}

void GradientReducer::exchange(const std::vector<size_t>& slots, ReduceResult& result) {
  if (options_.accumulateNorms) {
    std::vector<Span> sums;
    std::vector<ConstSpan> grads;
    for (size_t i : slots) {
      Slot& s = slots_[i];
      sums.push_back({s.normSum.data(), s.normSum.numel()});
      grads.push_back({s.parameter->grad.data(), s.parameter->grad.numel()});
    }
    backend_.accumulate(sums, grads);
  }
  std::vector<size_t> dense, powerSgd, topK;
  for (size_t i : slots)
    (compressed(slots_[i]) ? (options_.compressor == Compressor::PowerSgd ? powerSgd : topK) : dense).push_back(i);
  for (size_t i : dense) result.floatsSent += slots_[i].parameter->grad.numel();
  flushMemories(dense);
  if (!powerSgd.empty()) {
    reducePowerSgd(powerSgd);
    for (size_t i : powerSgd) result.floatsSent += (slots_[i].rows + slots_[i].cols) * rankOf(slots_[i]);
  }
  if (!topK.empty()) reduceTopK(topK, result);
  reduceDense(dense);
}

std::vector<std::vector<size_t>> gradientBuckets(const std::vector<Parameter*>& parameters, int64_t bytes) {
  std::vector<std::vector<size_t>> buckets;
  int64_t filled = 0;
  for (size_t k = parameters.size(); k-- > 0;) {
    if (buckets.empty() || filled >= (buckets.size() == 1 ? std::min(bytes, kFirstBucketBytes) : bytes)) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(k);
    filled += parameters[k]->grad.bytes();
  }
  return buckets;
}

void GradientReducer::startBuckets() {
  bucketsFirstBad_ = 0;
  for (Slot& s : slots_) s.saved = false;
}

void GradientReducer::save(Slot& s) {
  auto keep = [this](Tensor& copy, const Tensor& t) {
    if (!t.defined()) return;
    ensureShape(copy, t.shape(), backend_);
    backend_.copy(copy.data(), t.data(), t.bytes());
  };
  keep(s.savedMemory, s.memory);
  keep(s.savedQ, s.q);
  keep(s.savedNormSum, s.normSum);
  s.savedFlush = s.flushMemory;
  s.saved = true;
}

void GradientReducer::reduceBucket(const std::vector<size_t>& bucket, ReduceResult& result) {
  // Checked in parameter order, so that the first non-finite one is named as reduce() would name it.
  std::vector<size_t> ascending(bucket);
  std::sort(ascending.begin(), ascending.end());
  std::vector<ConstSpan> grads;
  for (size_t i : ascending) grads.push_back({slots_[i].parameter->grad.data(), slots_[i].parameter->grad.numel()});
  backend_.findNonFinite(grads, finiteFlag_.data());
  double bad = 0;
  backend_.download(&bad, finiteFlag_.data(), sizeof(double));
  backend_.synchronize();
  if (bad > 0) {
    // Noted for the agreement; the bucket still travels (as zeros), so every worker's collectives match.
    const int64_t first = static_cast<int64_t>(ascending[static_cast<size_t>(bad) - 1]) + 1;
    if (bucketsFirstBad_ == 0 || first < bucketsFirstBad_) bucketsFirstBad_ = first;
    for (size_t i : bucket) backend_.fill(slots_[i].parameter->grad.data(), slots_[i].parameter->grad.numel(), 0.0f);
  }
  for (size_t i : bucket) save(slots_[i]);
  communicationSeconds_ = 0;
  exchange(bucket, result);
  result.communicationSeconds += communicationSeconds_;
}

void GradientReducer::finishBuckets(ReduceResult& result) {
  communicationSeconds_ = 0;
  try {
    agree(bucketsFirstBad_, result);
  } catch (...) {
    restoreBuckets();
    throw;
  }
  result.communicationSeconds += communicationSeconds_;
}

void GradientReducer::restoreBuckets() {
  for (Slot& s : slots_) {
    if (!s.saved) continue;
    if (s.memory.defined()) backend_.copy(s.memory.data(), s.savedMemory.data(), s.memory.bytes());
    if (s.q.defined()) backend_.copy(s.q.data(), s.savedQ.data(), s.q.bytes());
    if (s.normSum.defined()) backend_.copy(s.normSum.data(), s.savedNormSum.data(), s.normSum.bytes());
    s.flushMemory = s.savedFlush;
    s.saved = false;
  }
  backend_.synchronize();
}

template <typename Fn>
void GradientReducer::communicate(Fn&& collective) {
  if (group_.onDevice()) backend_.synchronize();  // the buffer is complete; only the collective is timed
  const auto start = std::chrono::steady_clock::now();
  collective();
  communicationSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

float* GradientReducer::scratch(Tensor& buffer, int64_t n) {
  if (buffer.numel() < n) buffer = backend_.empty({n});
  return buffer.data();
}

void GradientReducer::flushMemories(const std::vector<size_t>& slots) {
  std::vector<Slot*> flushed;
  std::vector<Span> grads;
  std::vector<ConstSpan> memories;
  for (size_t i : slots) {
    Slot& s = slots_[i];
    if (!s.flushMemory || !s.memory.defined()) continue;
    s.flushMemory = false;
    flushed.push_back(&s);
    grads.push_back({s.parameter->grad.data(), s.parameter->grad.numel()});
    memories.push_back({s.memory.data(), s.memory.numel()});
  }
  if (flushed.empty()) return;
  backend_.accumulate(grads, memories);
  for (Slot* s : flushed) backend_.fill(s->memory.data(), s->memory.numel(), 0.0f);
}

void GradientReducer::reduceDense(const std::vector<size_t>& slots) {
  if (group_.size() == 1 || slots.empty()) return;
  std::vector<Span> grads;
  int64_t total = 0;
  for (size_t i : slots) {
    grads.push_back({slots_[i].parameter->grad.data(), slots_[i].parameter->grad.numel()});
    total += grads.back().size;
  }
  float* buffer = scratch(denseBuffer_, total);
  kernels_.pack(grads, buffer);
  communicate([&] { group_.allReduceSum(buffer, total); });
  kernels_.unpack(buffer, grads, 1.0f / static_cast<float>(group_.size()));
}

void GradientReducer::reducePowerSgd(const std::vector<size_t>& slots) {
  int64_t pTotal = 0, qTotal = 0;
  for (size_t i : slots) {
    const int64_t r = rankOf(slots_[i]);
    pTotal += slots_[i].rows * r;
    qTotal += slots_[i].cols * r;
  }
  float* p = scratch(pBuffer_, pTotal);
  float* qt = scratch(qBuffer_, qTotal);  // holds Qᵀ per matrix while it travels
  std::vector<PowerSgdMatrix> matrices;
  for (size_t i : slots) {
    Slot& s = slots_[i];
    const int64_t r = rankOf(s);
    matrices.push_back({s.parameter->grad.data(), s.memory.data(), s.q.data(), p, qt, s.rows, s.cols, r});
    p += s.rows * r;
    qt += s.cols * r;
  }
  // M = g + e and P = M·Q for every matrix, then one all-reduce of all P's.
  kernels_.powerSgdProject(matrices);
  communicate([&] { group_.allReduceSum(pBuffer_.data(), pTotal); });
  // Orthogonalise, Qᵀ = P̂ᵀ·M, then one all-reduce of all Q's.
  kernels_.powerSgdProjectBack(matrices, options_.orthogonalizationEps);
  communicate([&] { group_.allReduceSum(qBuffer_.data(), qTotal); });
  // out = P̂·Qᵀ becomes the gradient; the memory keeps M − out; Q is kept for the next step.
  kernels_.powerSgdDecompress(matrices, 1.0f / static_cast<float>(group_.size()));
}

void GradientReducer::reduceTopK(const std::vector<size_t>& slots, ReduceResult& result) {
  const int world = group_.size();
  std::vector<TopKTensor> tensors;
  int64_t perWorker = 0;
  for (size_t i : slots) {
    const int64_t n = slots_[i].parameter->grad.numel(), count = topKCount(slots_[i].level, n);
    tensors.push_back({slots_[i].parameter->grad.data(), slots_[i].memory.data(), nullptr, n, count, perWorker});
    perWorker += 2 * count;
    result.floatsSent += 2 * count * world;
  }
  float* send = scratch(sendBuffer_, perWorker);
  for (TopKTensor& t : tensors) t.send = send + t.offset;
  kernels_.topKSelect(tensors);
  const float* gathered = send;
  if (world > 1) {
    float* receive = scratch(receiveBuffer_, perWorker * world);
    communicate([&] { group_.allGather(send, perWorker, receive); });
    gathered = receive;
  }
  kernels_.topKCombine(tensors, gathered, world, perWorker, 1.0f / static_cast<float>(world));
}

void GradientReducer::resetErrorFeedback() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (s.memory.defined()) backend_.fill(s.memory.data(), s.memory.numel(), 0.0f);
    if (s.q.defined()) drawQ(i);
  }
}

std::vector<std::vector<LevelCost>> GradientReducer::levelCosts(const std::vector<double>& candidates) {
  if (!options_.accumulateNorms) throw invalidArgument("level costs need the epoch's gradient sums (accumulateNorms)");
  for (double c : candidates) checkLevel(c, "candidate level");
  const int world = group_.size();
  std::vector<std::vector<LevelCost>> out(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!s.matrix) continue;
    const int64_t numel = s.parameter->value.numel();
    const double norm = std::sqrt(backend_.sumsOfSquares({{s.normSum.data(), numel}})[0]);
    Tensor g = backend_.empty(s.parameter->value.shape()), residual = backend_.empty(s.parameter->value.shape());
    for (double level : candidates) {
      LevelCost cost{level, 0, numel, 0};
      if (compressedAt(s, level)) {
        // The residual is what error feedback would keep: M − out (PowerSGD), a − sparse(a) (TopK).
        // Only the kernels are timed: Q and the buffers are made once per level change, not per step.
        const bool powerSgd = options_.compressor == Compressor::PowerSgd;
        const int64_t r = rankAt(s, level), count = topKCount(level, numel);
        Tensor q, p, qt, send;
        if (powerSgd) {
          q = initialQ(i, r);
          p = backend_.empty({s.rows * r});
          qt = backend_.empty({s.cols * r});
        } else {
          send = backend_.empty({2 * count});
        }
        backend_.copy(g.data(), s.normSum.data(), g.bytes());
        backend_.fill(residual.data(), numel, 0.0f);
        backend_.synchronize();
        const auto start = std::chrono::steady_clock::now();
        if (powerSgd) {
          std::vector<PowerSgdMatrix> m{{g.data(), residual.data(), q.data(), p.data(), qt.data(), s.rows, s.cols, r}};
          kernels_.powerSgdProject(m);
          kernels_.powerSgdProjectBack(m, options_.orthogonalizationEps);
          kernels_.powerSgdDecompress(m, 1.0f);
          cost.floats = (s.rows + s.cols) * r;
        } else {
          std::vector<TopKTensor> t{{g.data(), residual.data(), send.data(), numel, count, 0}};
          kernels_.topKSelect(t);
          cost.floats = 2 * count * world;
        }
        backend_.synchronize();
        cost.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (norm > 0) cost.error = std::sqrt(backend_.sumsOfSquares({{residual.data(), numel}})[0]) / norm;
      }
      out[i].push_back(cost);
    }
  }
  return out;
}

std::vector<double> GradientReducer::takeGradientNorms() {
  if (!options_.accumulateNorms) throw invalidArgument("gradient norms are not being accumulated");
  std::vector<ConstSpan> sums;
  for (const Slot& s : slots_) sums.push_back({s.normSum.data(), s.normSum.numel()});
  std::vector<double> norms = backend_.sumsOfSquares(sums);
  for (double& n : norms) n = std::sqrt(n);
  for (Slot& s : slots_) backend_.fill(s.normSum.data(), s.normSum.numel(), 0.0f);
  return norms;
}

}  // namespace accordion
