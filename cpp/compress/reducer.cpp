#include "compress/reducer.h"

#include <algorithm>
#include <cmath>

#include "compress/powersgd.h"
#include "compress/topk.h"

namespace accordion {

static std::unique_ptr<ErrorFeedbackCompressor> makeCompressor(const ReducerOptions& o, const std::vector<Parameter*>& parameters,
                                                               Backend& backend) {
  switch (o.compressor) {
    case Compressor::PowerSgd:
      return std::make_unique<PowerSgdCompressor>(parameters, o.level, o.seed, o.orthogonalizationEps, o.sent,
                                                  backend);
    case Compressor::TopK: return std::make_unique<TopKCompressor>(parameters, o.level, o.sent, backend);
    default: return nullptr;
  }
}

GradientReducer::GradientReducer(std::vector<Parameter*> parameters, const ReducerOptions& options, ProcessGroup& group,
                                 Backend& backend)
    : options_(options), group_(group), backend_(backend), parameters_(parameters),
      compressor_(makeCompressor(options, parameters, backend)), finiteFlag_(1, backend) {
  if (options.sent != Precision::Fp32 && group.onDevice())
    throw invalidArgument(std::string("gradients sent in ") + precisionName(options.sent) +
                          " are exchanged from host memory; this job's collectives run on the GPU (send fp32 there)");
  for (Parameter* p : parameters) {
    Slot s;
    s.parameter = p;
    const Shape& shape = p->value.shape();
    s.matrix = shape.size() > 1;
    s.rows = shape.empty() ? 1 : shape[0];
    s.cols = s.rows ? p->value.numel() / s.rows : 0;
    if (s.matrix && compressor_) s.level = options.level;
    if (options.accumulateNorms) s.normSum = backend.zeros(shape);
    slots_.push_back(std::move(s));
  }
}

MatrixView GradientReducer::view(size_t index, double level) const {
  const Slot& s = slots_[index];
  return {index, s.parameter, s.rows, s.cols, level};
}

void GradientReducer::checkLevel(double level, const std::string& where, bool allowDense) const {
  if (!compressor_) throw invalidArgument(where + ": no compressor is active, so there are no levels to set");
  if (allowDense && level == 0) return;
  if (allowDense && level == kDenseBf16) {
    if (group_.onDevice())
      throw invalidArgument(where + ": dense in bf16 (" + std::to_string(static_cast<int>(kDenseBf16)) +
                            ") is exchanged from host memory; this job's collectives run on the GPU");
    return;
  }
  compressor_->checkLevel(level, where);
}

void GradientReducer::setLevel(size_t index, double level) {
  Slot& s = slots_.at(index);
  const std::string where = "level of '" + s.parameter->name + "'";
  checkLevel(level, where);
  if (!s.matrix) throw invalidArgument(where + ": the parameter is 1-D and always sent dense");
  if (level == s.level) return;  // keeps PowerSGD's warm-started Q
  s.level = level;
  if (level == 0) compressor_->setOwes(index, true);
  compressor_->levelChanged(view(index));
}

bool GradientReducer::compressedAt(const Slot& s, double level) const {
  return routeOf(options_.compressor, s.parameter->value.shape(), level, options_.minCompressionRate) == Route::Compressed;
}

bool GradientReducer::roundedAt(const Slot& s, double level) const {
  return routeOf(options_.compressor, s.parameter->value.shape(), level, options_.minCompressionRate) == Route::DenseBf16;
}

bool GradientReducer::isCompressed(size_t index) const { return compressed(slots_.at(index)); }

int64_t GradientReducer::floatsAt(const Slot& s, double level) const {
  return compressedAt(s, level) ? compressor_->floats(s.rows, s.cols, level, group_.size()) : s.parameter->value.numel();
}

int64_t GradientReducer::bytesAt(const Slot& s, double level) const {
  if (compressedAt(s, level)) return compressor_->bytes(s.rows, s.cols, level, group_.size());
  return s.parameter->value.numel() * bytesPerValue(roundedAt(s, level) ? Precision::Bf16 : options_.sent);
}

int64_t GradientReducer::floatsPerStep() const {
  int64_t total = 0;
  for (const Slot& s : slots_) total += floatsAt(s, s.level);
  return total;
}

int64_t GradientReducer::bytesPerStep() const {
  int64_t total = 0;
  for (const Slot& s : slots_) total += bytesAt(s, s.level);
  return total;
}

std::vector<std::pair<std::string, Tensor*>> GradientReducer::compressorState(size_t index) {
  return compressor_ ? compressor_->state(index) : std::vector<std::pair<std::string, Tensor*>>{};
}

Tensor* GradientReducer::compressorState(size_t index, const std::string& key) {
  for (auto [k, tensor] : compressorState(index))
    if (k == key) return tensor;
  return nullptr;
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
  ReduceResult result;
  TimedGroup group(group_, backend_);
  agree(firstBad, result, group);
  result.add(group);
  std::vector<size_t> all(slots_.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  exchange(all, result);
  return result;
}

void GradientReducer::agree(int64_t firstBad, ReduceResult& result, TimedGroup& group) {
  // Workers agree before any memory, sum or weight changes, so a NaN on one worker stops the step
  // on all of them instead of leaving the others in a collective. Each publishes its result in its
  // own slot.
  std::vector<float> badIndex(group_.size(), 0.0f);
  badIndex[group_.rank()] = static_cast<float>(firstBad);
  if (group_.size() > 1) {
    result.overheadFloats = group_.size();
    if (group_.onDevice()) {
      float* flags = scratch(agreementBuffer_, group_.size(), backend_);
      backend_.upload(flags, badIndex.data(), badIndex.size() * sizeof(float));
      group.allReduceSum(flags, group_.size());
      backend_.download(badIndex.data(), flags, badIndex.size() * sizeof(float));
      backend_.synchronize();
    } else {
      group.allReduceSum(badIndex.data(), group_.size());
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
  TimedGroup group(group_, backend_);
  std::vector<size_t> dense;
  std::vector<MatrixView> matrices, rounded;
  for (size_t i : slots) {
    if (compressed(slots_[i])) matrices.push_back(view(i));
    else if (roundedAt(slots_[i], slots_[i].level)) rounded.push_back(view(i));
    else dense.push_back(i);
  }
  for (size_t i : slots) {
    result.floatsSent += floatsAt(slots_[i], slots_[i].level);
    result.bytesSent += bytesAt(slots_[i], slots_[i].level);
  }
  if (compressor_) compressor_->payOwed(dense, parameters_);
  if (!matrices.empty()) compressor_->exchange(matrices, group);
  if (!rounded.empty()) compressor_->exchangeRounded(rounded, Precision::Bf16, group);
  reduceDense(dense, group);
  result.add(group);
  if ((options_.sent != Precision::Fp32 || !rounded.empty()) && group_.size() > 1) checkInRange(slots);
}

int64_t GradientReducer::firstNonFiniteAmong(const std::vector<size_t>& slots) {
  std::vector<ConstSpan> grads;
  for (size_t i : slots) grads.push_back({slots_[i].parameter->grad.data(), slots_[i].parameter->grad.numel()});
  backend_.findNonFinite(grads, finiteFlag_.data());
  double bad = 0;
  backend_.download(&bad, finiteFlag_.data(), sizeof(double));
  backend_.synchronize();
  return static_cast<int64_t>(bad);
}

void GradientReducer::checkInRange(const std::vector<size_t>& slots) {
  const int64_t bad = firstNonFiniteAmong(slots);
  if (bad == 0) return;
  const Slot& s = slots_[slots[static_cast<size_t>(bad) - 1]];
  const bool rounded = roundedAt(s, s.level);
  const Precision sent = rounded ? Precision::Bf16 : options_.sent;
  const std::string cure = rounded ? "Price automatic levels in floats (--auto-cost floats), which leaves dense in bf16 out"
                                   : std::string("Send it in ") + (sent == Precision::Fp16 ? "bf16 (fp32's range) or fp32" : "fp32") + " (--comm-dtype)";
  throw numericalError("the gradient of '" + s.parameter->name + "' left " + precisionName(sent) + "'s range in the exchange (" +
                       (sent == Precision::Fp16 ? "a value sent beyond ±65504" : "a value rounded to Inf") +
                       "); the step was stopped on every worker. " + cure);
}

std::vector<std::vector<size_t>> gradientBuckets(const std::vector<Parameter*>& parameters, int64_t bytes) {
  std::vector<int64_t> gradientBytes;
  for (const Parameter* p : parameters) gradientBytes.push_back(p->grad.bytes());
  return gradientBuckets(gradientBytes, bytes);
}

void GradientReducer::startBuckets() {
  bucketsFirstBad_ = 0;
  for (Slot& s : slots_) s.isSaved = false;
}

void GradientReducer::save(size_t index) {
  Slot& s = slots_[index];
  auto keep = [this](Tensor& copy, const Tensor& t) {
    ensureShape(copy, t.shape(), backend_);
    backend_.copy(copy.data(), t.data(), t.bytes());
  };
  const auto state = compressorState(index);
  s.saved.resize(state.size());
  for (size_t k = 0; k < state.size(); ++k) keep(s.saved[k], *state[k].second);
  if (s.normSum.defined()) keep(s.savedNormSum, s.normSum);
  s.savedOwes = compressor_ && compressor_->owes(index);
  s.isSaved = true;
}

void GradientReducer::reduceBucket(const std::vector<size_t>& bucket, ReduceResult& result) {
  // Checked in parameter order, so that the first non-finite one is named as reduce() would name it.
  std::vector<size_t> ascending(bucket);
  std::sort(ascending.begin(), ascending.end());
  const int64_t bad = firstNonFiniteAmong(ascending);
  if (bad > 0) {
    // Noted for the agreement; the bucket still travels (as zeros), so every worker's collectives match.
    const int64_t first = static_cast<int64_t>(ascending[static_cast<size_t>(bad) - 1]) + 1;
    if (bucketsFirstBad_ == 0 || first < bucketsFirstBad_) bucketsFirstBad_ = first;
    for (size_t i : bucket) backend_.fill(slots_[i].parameter->grad.data(), slots_[i].parameter->grad.numel(), 0.0f);
  }
  for (size_t i : bucket) save(i);
  exchange(bucket, result);
}

void GradientReducer::finishBuckets(ReduceResult& result) {
  TimedGroup group(group_, backend_);
  try {
    agree(bucketsFirstBad_, result, group);
  } catch (...) {
    restoreBuckets();
    throw;
  }
  result.add(group);
}

void GradientReducer::restoreBuckets() {
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    if (!s.isSaved) continue;
    const auto state = compressorState(i);
    for (size_t k = 0; k < state.size(); ++k) backend_.copy(state[k].second->data(), s.saved[k].data(), s.saved[k].bytes());
    if (s.normSum.defined()) backend_.copy(s.normSum.data(), s.savedNormSum.data(), s.normSum.bytes());
    if (compressor_) compressor_->setOwes(i, s.savedOwes);
    s.isSaved = false;
  }
  backend_.synchronize();
}

void GradientReducer::reduceDense(const std::vector<size_t>& slots, TimedGroup& group) {
  if (group_.size() == 1 || slots.empty()) return;
  std::vector<Span> grads;
  int64_t total = 0;
  for (size_t i : slots) {
    grads.push_back({slots_[i].parameter->grad.data(), slots_[i].parameter->grad.numel()});
    total += grads.back().size;
  }
  float* buffer = scratch(denseBuffer_, total, backend_);
  CompressionKernels& kernels = backend_.compression();
  kernels.pack(grads, buffer);
  group.allReduceSum(buffer, total, options_.sent);
  kernels.unpack(buffer, grads, 1.0f / static_cast<float>(group_.size()));
}

void GradientReducer::resetErrorFeedback() {
  if (!compressor_) return;
  std::vector<MatrixView> matrices;
  for (size_t i = 0; i < slots_.size(); ++i)
    if (slots_[i].matrix) matrices.push_back(view(i));
  compressor_->reset(matrices);
}

std::vector<std::vector<LevelCost>> GradientReducer::levelCosts(const std::vector<double>& candidates) {
  if (!options_.accumulateNorms) throw invalidArgument("level costs need the epoch's gradient sums (accumulateNorms)");
  for (double c : candidates) checkLevel(c, "candidate level");
  std::vector<std::vector<LevelCost>> out(slots_.size());
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& s = slots_[i];
    if (!s.matrix) continue;
    for (double level : candidates) {
      if (compressedAt(s, level)) {
        out[i].push_back(compressor_->price(view(i, level), s.normSum, group_.size()));
        continue;
      }
      LevelCost cost{level, 0, floatsAt(s, level), bytesAt(s, level), 0};
      if (roundedAt(s, level)) cost.error = roundingError(s.normSum, Precision::Bf16);
      out[i].push_back(cost);
    }
  }
  return out;
}

double GradientReducer::roundingError(const Tensor& sum, Precision p) const {
  const Tensor host = backend_.toHost(sum);
  double lost = 0, norm = 0;
  for (int64_t k = 0; k < host.numel(); ++k) {
    const double x = host.data()[k], d = x - roundTo(p, host.data()[k]);
    lost += d * d;
    norm += x * x;
  }
  return norm > 0 ? std::sqrt(lost / norm) : 0;
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
