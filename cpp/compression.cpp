#include "compression.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

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

static uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x2545F4914F6CDD1Dull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

GradientReducer::GradientReducer(std::vector<Parameter*> parameters, const ReducerOptions& options, ProcessGroup& group)
    : options_(options), group_(group) {
  if (options.compressor != Compressor::None) checkLevel(options.level, "initial level");
  for (Parameter* p : parameters) {
    Slot s;
    s.parameter = p;
    const Shape& shape = p->value.shape();
    s.matrix = shape.size() > 1;
    s.rows = shape.empty() ? 1 : shape[0];
    s.cols = s.rows ? p->value.numel() / s.rows : 0;
    if (s.matrix && options.compressor != Compressor::None) {
      s.level = options.level;
      s.memory = Tensor::zeros(shape);
    }
    if (options.accumulateNorms) s.normSum = Tensor::zeros(shape);
    slots_.push_back(std::move(s));
  }
  for (size_t i = 0; i < slots_.size(); ++i)
    if (options_.compressor == Compressor::PowerSgd && slots_[i].matrix) drawQ(i);
}

void GradientReducer::checkLevel(double level, const std::string& where) const {
  if (options_.compressor == Compressor::PowerSgd) {
    if (!std::isfinite(level) || level < 1 || level != std::floor(level))
      throw invalidArgument(where + ": a PowerSGD rank must be a positive integer, got " + std::to_string(level));
  } else if (options_.compressor == Compressor::TopK) {
    if (!(level > 0 && level <= 1))
      throw invalidArgument(where + ": a TopK ratio must lie in (0, 1], got " + std::to_string(level));
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
  if (options_.compressor == Compressor::PowerSgd) drawQ(index);
}

int64_t GradientReducer::rankOf(const Slot& s) const {
  return std::min<int64_t>({s.rows, s.cols, static_cast<int64_t>(s.level)});
}

bool GradientReducer::compressed(const Slot& s) const {
  if (!s.matrix || options_.compressor == Compressor::None) return false;
  if (options_.compressor == Compressor::TopK) return true;
  const double r = static_cast<double>(rankOf(s));
  return options_.minCompressionRate <= 0 ||
         (static_cast<double>(s.rows + s.cols) * r * options_.minCompressionRate < static_cast<double>(s.rows * s.cols));
}

bool GradientReducer::isCompressed(size_t index) const { return compressed(slots_.at(index)); }

void GradientReducer::drawQ(size_t index) {
  Slot& s = slots_[index];
  s.q = Tensor({s.cols, rankOf(s)});
  Random rng(mix(options_.seed, index));
  for (int64_t i = 0; i < s.q.numel(); ++i) s.q.data()[i] = rng.normal();
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

ReduceResult GradientReducer::reduce() {
  // Refuse non-finite gradients before any memory, sum or weight changes. Workers agree first, so a
  // NaN on one worker stops the step on all of them instead of leaving the others in a collective.
  const Slot* bad = nullptr;
  for (const Slot& s : slots_) {
    const float* g = s.parameter->grad.data();
    const int64_t n = s.parameter->grad.numel();
    bool finite = true;
#pragma omp parallel for simd reduction(&& : finite) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) finite = finite && std::isfinite(g[i]);
    if (!finite) {
      bad = &s;
      break;
    }
  }
  // Each worker publishes 1 + the index of its first bad parameter (0: none) in its own slot.
  std::vector<float> badIndex(group_.size(), 0.0f);
  badIndex[group_.rank()] = bad ? static_cast<float>(bad - slots_.data() + 1) : 0.0f;
  communicationSeconds_ = 0;
  if (group_.size() > 1) communicate([&] { group_.allReduceSum(badIndex.data(), group_.size()); });
  for (int r = 0; r < group_.size(); ++r)
    if (badIndex[r] > 0)
      throw numericalError("the gradient of '" + slots_[static_cast<size_t>(badIndex[r]) - 1].parameter->name +
                           "' contains NaN or Inf on rank " + std::to_string(r) + "; the step was skipped on every worker");
  std::vector<size_t> dense, powerSgd, topK;
  for (size_t i = 0; i < slots_.size(); ++i) {
    Slot& s = slots_[i];
    const bool isCompressed = compressed(s);
    float* g = s.parameter->grad.data();
    float* sum = options_.accumulateNorms ? s.normSum.data() : nullptr;
    // PowerSGD adds the memory in its first kernel, fused with P = M·Q.
    float* memory = isCompressed && options_.compressor == Compressor::TopK ? s.memory.data() : nullptr;
    const int64_t n = s.parameter->grad.numel();
    // One pass: the epoch sum of raw gradients and TopK's error-feedback input a = g + e (kept in e).
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t k = 0; k < n; ++k) {
      if (sum) sum[k] += g[k];
      if (memory) memory[k] += g[k];
    }
    (isCompressed ? (options_.compressor == Compressor::PowerSgd ? powerSgd : topK) : dense).push_back(i);
  }
  ReduceResult result;
  for (size_t i : dense) result.floatsSent += slots_[i].parameter->grad.numel();
  if (!powerSgd.empty()) {
    reducePowerSgd(powerSgd);
    for (size_t i : powerSgd) result.floatsSent += (slots_[i].rows + slots_[i].cols) * rankOf(slots_[i]);
  }
  if (!topK.empty()) reduceTopK(topK, result);
  reduceDense(dense);
  result.communicationSeconds = communicationSeconds_;
  return result;
}

template <typename Fn>
void GradientReducer::communicate(Fn&& collective) {
  const auto start = std::chrono::steady_clock::now();
  collective();
  communicationSeconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

void GradientReducer::reduceDense(const std::vector<size_t>& slots) {
  if (group_.size() == 1 || slots.empty()) return;
  int64_t total = 0;
  for (size_t i : slots) total += slots_[i].parameter->grad.numel();
  denseBuffer_.resize(total);
  int64_t offset = 0;
  for (size_t i : slots) {
    const Tensor& g = slots_[i].parameter->grad;
    std::memcpy(denseBuffer_.data() + offset, g.data(), g.numel() * sizeof(float));
    offset += g.numel();
  }
  communicate([&] { group_.allReduceSum(denseBuffer_.data(), total); });
  const float inv = 1.0f / static_cast<float>(group_.size());
  offset = 0;
  for (size_t i : slots) {
    Tensor& g = slots_[i].parameter->grad;
    for (int64_t k = 0; k < g.numel(); ++k) g.data()[k] = denseBuffer_[offset + k] * inv;
    offset += g.numel();
  }
}

// The three passes over each matrix are fused, memory-bound OpenMP loops rather than BLAS calls:
// with rank r ≤ a few, P = M·Q and Q = Mᵀ·P̂ are matrix-vector products that BLAS runs no faster,
// and fusing them with the error-feedback updates saves whole passes over the gradients.
namespace {

// Qᵀ (r, cols) from Q (cols, r), so every kernel reads Q contiguously along a row of M.
void transposeQ(const float* q, int64_t cols, int64_t r, std::vector<float>& qt) {
  qt.resize(static_cast<size_t>(cols * r));
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t k = 0; k < r; ++k) qt[k * cols + j] = q[j * r + k];
}

// M = g + e, stored in e; P = M·Q (rows, r).
void feedbackAndProject(const float* g, float* memory, const float* qt, float* p, int64_t rows, int64_t cols, int64_t r) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t i = 0; i < rows; ++i) {
    const float* gRow = g + i * cols;
    float* mRow = memory + i * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) mRow[j] += gRow[j];
    for (int64_t k = 0; k < r; ++k) {
      const float* qk = qt + k * cols;
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < cols; ++j) dot += mRow[j] * qk[j];
      p[i * r + k] = dot;
    }
  }
}

// Qᵀ = P̂ᵀ·M (r, cols): each thread owns a block of columns and walks all rows.
void projectBack(const float* memory, const float* p, float* qt, int64_t rows, int64_t cols, int64_t r) {
  std::fill(qt, qt + r * cols, 0.0f);
#pragma omp parallel if (rows * cols > 65536)
  {
    const int threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = cols * t / threads, end = cols * (t + 1) / threads;
    for (int64_t i = 0; i < rows; ++i) {
      const float* mRow = memory + i * cols;
      for (int64_t k = 0; k < r; ++k) {
        const float pik = p[i * r + k];
        float* qk = qt + k * cols;
#pragma omp simd
        for (int64_t j = begin; j < end; ++j) qk[j] += pik * mRow[j];
      }
    }
  }
}

// out = P̂·Qᵀ written to g; e = M − out.
void decompress(const float* p, const float* qt, float* g, float* memory, int64_t rows, int64_t cols, int64_t r) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t i = 0; i < rows; ++i) {
    float* gRow = g + i * cols;
    float* mRow = memory + i * cols;
    const float p0 = p[i * r];
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) gRow[j] = p0 * qt[j];
    for (int64_t k = 1; k < r; ++k) {
      const float pk = p[i * r + k];
      const float* qk = qt + k * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) gRow[j] += pk * qk[j];
    }
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) mRow[j] -= gRow[j];
  }
}

}  // namespace

void GradientReducer::reducePowerSgd(const std::vector<size_t>& slots) {
  std::vector<int64_t> pOffset, qOffset;
  int64_t pTotal = 0, qTotal = 0;
  for (size_t i : slots) {
    const int64_t r = rankOf(slots_[i]);
    pOffset.push_back(pTotal);
    qOffset.push_back(qTotal);
    pTotal += slots_[i].rows * r;
    qTotal += slots_[i].cols * r;
  }
  pBuffer_.resize(pTotal);
  qBuffer_.resize(qTotal);  // holds Qᵀ per matrix while it travels
  std::vector<float> qt;
  // M = g + e and P = M·Q for every matrix, then one all-reduce of all P's.
  for (size_t k = 0; k < slots.size(); ++k) {
    Slot& s = slots_[slots[k]];
    const int64_t r = rankOf(s);
    transposeQ(s.q.data(), s.cols, r, qt);
    feedbackAndProject(s.parameter->grad.data(), s.memory.data(), qt.data(), pBuffer_.data() + pOffset[k], s.rows, s.cols, r);
  }
  communicate([&] { group_.allReduceSum(pBuffer_.data(), pTotal); });
  // Orthogonalise, Qᵀ = P̂ᵀ·M, then one all-reduce of all Q's.
  for (size_t k = 0; k < slots.size(); ++k) {
    const Slot& s = slots_[slots[k]];
    const int64_t r = rankOf(s);
    float* p = pBuffer_.data() + pOffset[k];
    orthogonalizeColumns(p, s.rows, r, options_.orthogonalizationEps);
    projectBack(s.memory.data(), p, qBuffer_.data() + qOffset[k], s.rows, s.cols, r);
  }
  communicate([&] { group_.allReduceSum(qBuffer_.data(), qTotal); });
  const float inv = 1.0f / static_cast<float>(group_.size());
  for (float& v : qBuffer_) v *= inv;
  // out = P̂·Qᵀ becomes the gradient; the memory keeps M − out; Q is kept for the next step.
  for (size_t k = 0; k < slots.size(); ++k) {
    Slot& s = slots_[slots[k]];
    const int64_t r = rankOf(s);
    const float* qtk = qBuffer_.data() + qOffset[k];
    for (int64_t j = 0; j < s.cols; ++j)
      for (int64_t c = 0; c < r; ++c) s.q.data()[j * r + c] = qtk[c * s.cols + j];
    decompress(pBuffer_.data() + pOffset[k], qtk, s.parameter->grad.data(), s.memory.data(), s.rows, s.cols, r);
  }
}

void GradientReducer::reduceTopK(const std::vector<size_t>& slots, ReduceResult& result) {
  const int world = group_.size();
  std::vector<int64_t> counts, offsets;
  int64_t perWorker = 0;
  for (size_t i : slots) {
    const int64_t s = topKCount(slots_[i].level, slots_[i].parameter->grad.numel());
    counts.push_back(s);
    offsets.push_back(perWorker);
    perWorker += 2 * s;
  }
  sendBuffer_.resize(perWorker);
  std::vector<int32_t> indices;
  for (size_t k = 0; k < slots.size(); ++k) {
    Slot& s = slots_[slots[k]];
    float* a = s.memory.data();  // a = g + e
    selectTopK(a, s.parameter->grad.numel(), counts[k], indices);
    float* idxOut = sendBuffer_.data() + offsets[k];
    float* valOut = idxOut + counts[k];
    for (int64_t j = 0; j < counts[k]; ++j) {
      std::memcpy(&idxOut[j], &indices[j], sizeof(float));  // indices travel as raw bits
      valOut[j] = a[indices[j]];
      a[indices[j]] = 0.0f;  // e = a − sparse(a)
    }
    result.floatsSent += 2 * counts[k] * world;
  }
  receiveBuffer_.resize(perWorker * world);
  communicate([&] { group_.allGather(sendBuffer_.data(), perWorker, receiveBuffer_.data()); });
  const float inv = 1.0f / static_cast<float>(world);
  for (size_t k = 0; k < slots.size(); ++k) {
    Tensor& g = slots_[slots[k]].parameter->grad;
    g.fill(0.0f);
    for (int w = 0; w < world; ++w) {
      const float* idx = receiveBuffer_.data() + w * perWorker + offsets[k];
      const float* val = idx + counts[k];
      for (int64_t j = 0; j < counts[k]; ++j) {
        int32_t index;
        std::memcpy(&index, &idx[j], sizeof(index));
        g.data()[index] += val[j] * inv;
      }
    }
  }
}

std::vector<double> GradientReducer::takeGradientNorms() {
  if (!options_.accumulateNorms) throw invalidArgument("gradient norms are not being accumulated");
  std::vector<double> norms;
  for (Slot& s : slots_) {
    const float* v = s.normSum.data();
    const int64_t n = s.normSum.numel();
    double total = 0;
#pragma omp parallel for simd reduction(+ : total) schedule(static) if (n > 65536)
    for (int64_t k = 0; k < n; ++k) total += static_cast<double>(v[k]) * v[k];
    norms.push_back(std::sqrt(total));
    s.normSum.fill(0.0f);
  }
  return norms;
}

void orthogonalizeColumns(float* m, int64_t rows, int64_t cols, float eps) {
  for (int64_t i = 0; i < cols; ++i) {
    double norm = 0;
    for (int64_t k = 0; k < rows; ++k) norm += static_cast<double>(m[k * cols + i]) * m[k * cols + i];
    const float scale = static_cast<float>(1.0 / (std::sqrt(norm) + eps));
    for (int64_t k = 0; k < rows; ++k) m[k * cols + i] *= scale;
    for (int64_t j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < rows; ++k) dot += static_cast<double>(m[k * cols + i]) * m[k * cols + j];
      const float d = static_cast<float>(dot);
      for (int64_t k = 0; k < rows; ++k) m[k * cols + j] -= d * m[k * cols + i];
    }
  }
}

// Radix select on the magnitude bits: for non-negative floats the IEEE bit pattern orders like the
// value, so the top bits bucket the entries; the bucket holding the count-th largest is then
// resolved exactly. Two passes gather the winners in index order.
void selectTopK(const float* values, int64_t n, int64_t count, std::vector<int32_t>& indices) {
  indices.resize(count);
  if (count <= 0) return;
  if (count >= n) {
    for (int64_t i = 0; i < n; ++i) indices[i] = static_cast<int32_t>(i);
    return;
  }
  auto key = [values](int64_t i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof(bits));
    return bits & 0x7FFFFFFFu;
  };
  constexpr int kShift = 20, kBuckets = 1 << 11;  // the top 11 bits of the 31-bit magnitude
  // Every pass splits [0, n) into the same contiguous chunks, one per thread, so per-chunk counts
  // give each chunk's output offset.
  const int chunks = n > (1 << 16) ? omp_get_max_threads() : 1;
  auto chunkBegin = [n, chunks](int t) { return n * t / chunks; };
  std::vector<int64_t> histograms(static_cast<size_t>(chunks) * kBuckets, 0);
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
  for (int t = 0; t < chunks; ++t) {
    // Four interleaved sub-histograms: neighbouring gradients often share a bucket, and one
    // histogram would serialise on its increments.
    std::vector<int32_t> sub(4 * kBuckets, 0);
    const int64_t begin = chunkBegin(t), end = chunkBegin(t + 1);
    int64_t i = begin;
    for (; i + 4 <= end; i += 4) {
      ++sub[key(i) >> kShift];
      ++sub[kBuckets + (key(i + 1) >> kShift)];
      ++sub[2 * kBuckets + (key(i + 2) >> kShift)];
      ++sub[3 * kBuckets + (key(i + 3) >> kShift)];
    }
    for (; i < end; ++i) ++sub[key(i) >> kShift];
    int64_t* h = histograms.data() + static_cast<size_t>(t) * kBuckets;
    for (int b = 0; b < kBuckets; ++b) h[b] = sub[b] + sub[kBuckets + b] + sub[2 * kBuckets + b] + sub[3 * kBuckets + b];
  }
  auto bucketCount = [&](int b) {
    int64_t total = 0;
    for (int t = 0; t < chunks; ++t) total += histograms[static_cast<size_t>(t) * kBuckets + b];
    return total;
  };
  int bucket = kBuckets - 1;
  int64_t above = 0;
  while (above + bucketCount(bucket) < count) above += bucketCount(bucket--);
  // Exact threshold inside that bucket: gather its keys, each chunk into its own slice.
  std::vector<int64_t> slice(chunks + 1, 0);
  for (int t = 0; t < chunks; ++t) slice[t + 1] = slice[t] + histograms[static_cast<size_t>(t) * kBuckets + bucket];
  std::vector<uint32_t> candidates(slice[chunks]);
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
  for (int t = 0; t < chunks; ++t) {
    int64_t out = slice[t];
    for (int64_t i = chunkBegin(t); i < chunkBegin(t + 1); ++i)
      if (static_cast<int>(key(i) >> kShift) == bucket) candidates[out++] = key(i);
  }
  const int64_t need = count - above;  // how many of the bucket's entries are kept, ≥ 1
  std::nth_element(candidates.begin(), candidates.begin() + (need - 1), candidates.end(), std::greater<uint32_t>());
  const uint32_t threshold = candidates[need - 1];
  int64_t greaterInBucket = 0;
  for (uint32_t c : candidates) greaterInBucket += c > threshold;
  const int64_t equalToTake = need - greaterInBucket;

  // Per-chunk counts, then each chunk writes its winners at its offset (lowest indices take the ties).
  std::vector<int64_t> greater(chunks + 1, 0), equal(chunks + 1, 0);
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
  for (int t = 0; t < chunks; ++t) {
    int64_t g = 0, e = 0;
    for (int64_t i = chunkBegin(t); i < chunkBegin(t + 1); ++i) {
      const uint32_t k = key(i);
      g += k > threshold;
      e += k == threshold;
    }
    greater[t + 1] = g;
    equal[t + 1] = e;
  }
  for (int t = 0; t < chunks; ++t) {
    greater[t + 1] += greater[t];
    equal[t + 1] += equal[t];
  }
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
  for (int t = 0; t < chunks; ++t) {
    int64_t equalBefore = equal[t];
    int64_t out = greater[t] + std::min(equalBefore, equalToTake);
    for (int64_t i = chunkBegin(t); i < chunkBegin(t + 1); ++i) {
      const uint32_t k = key(i);
      if (k > threshold || (k == threshold && equalBefore++ < equalToTake)) indices[out++] = static_cast<int32_t>(i);
    }
  }
}

}  // namespace accordion
