// TopK: the largest magnitudes of a = g + e in linear time, and the average of every worker's pairs.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "ops/cpu_compression_kernels.h"

namespace accordion {

void CpuCompressionKernels::topKSelect(const std::vector<TopKTensor>& tensors) {
  for (const TopKTensor& t : tensors) {
    float* a = t.memory;
    const float* g = t.grad;
    const int64_t n = t.size;
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t k = 0; k < n; ++k) a[k] += g[k];
    selectTopK(a, n, t.count, indices_);
    float* idxOut = t.send;
    float* valOut = idxOut + t.count;
    for (int64_t j = 0; j < t.count; ++j) {
      std::memcpy(&idxOut[j], &indices_[j], sizeof(float));  // indices travel as raw bits
      valOut[j] = a[indices_[j]];
      a[indices_[j]] = 0.0f;  // e = a − sparse(a)
    }
  }
}

void CpuCompressionKernels::topKCombine(const std::vector<TopKTensor>& tensors, const float* gathered, int world, int64_t perWorker,
                                        float scale) {
  for (const TopKTensor& t : tensors) {
    std::fill(t.grad, t.grad + t.size, 0.0f);
    for (int w = 0; w < world; ++w) {
      const float* idx = gathered + w * perWorker + t.offset;
      const float* val = idx + t.count;
      for (int64_t j = 0; j < t.count; ++j) {
        int32_t index;
        std::memcpy(&index, &idx[j], sizeof(index));
        t.grad[index] += val[j] * scale;
      }
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
