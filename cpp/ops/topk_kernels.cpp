// TopK: the largest magnitudes of a = g + e in linear time, and the average of every worker's pairs.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "ops/cpu_compression_kernels.h"

namespace accordion {

// Above this many entries a pass is split between the threads.
constexpr int64_t kParallelFrom = 65536;

void CpuCompressionKernels::topKSelect(const std::vector<TopKTensor>& tensors) {
  for (const TopKTensor& t : tensors) {
    float* a = t.memory;
    const float* g = t.grad;
    const int64_t n = t.size, count = t.count;
#pragma omp parallel for simd schedule(static) if (n > kParallelFrom)
    for (int64_t k = 0; k < n; ++k) a[k] += g[k];
    selectTopK(a, n, count, indices_);
    float* idxOut = t.send;
    float* valOut = idxOut + count;
    const int32_t* chosen = indices_.data();
#pragma omp parallel for schedule(static) if (count > kParallelFrom)
    for (int64_t j = 0; j < count; ++j) {
      std::memcpy(&idxOut[j], &chosen[j], sizeof(float));  // indices travel as raw bits
      valOut[j] = a[chosen[j]];
      a[chosen[j]] = 0.0f;  // e = a − sparse(a)
    }
  }
}

void CpuCompressionKernels::topKCombine(const std::vector<TopKTensor>& tensors, const float* gathered, int world, int64_t perWorker,
                                        float scale) {
  for (const TopKTensor& t : tensors) {
    float* out = t.grad;
#pragma omp parallel for simd schedule(static) if (t.size > kParallelFrom)
    for (int64_t k = 0; k < t.size; ++k) out[k] = 0.0f;
    // One worker's indices are distinct, so its pairs scatter in parallel; the workers in turn.
    for (int w = 0; w < world; ++w) {
      const float* idx = gathered + w * perWorker + t.offset;
      const float* val = idx + t.count;
#pragma omp parallel for schedule(static) if (t.count > kParallelFrom)
      for (int64_t j = 0; j < t.count; ++j) {
        int32_t index;
        std::memcpy(&index, &idx[j], sizeof(index));
        out[index] += val[j] * scale;
      }
    }
  }
}

// Radix select on the magnitude bits: for non-negative floats the IEEE bit pattern orders like the
// value, so the top bits bucket the entries; the bucket holding the count-th largest is then
// resolved exactly among its own entries. One more pass writes the winners in index order.
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
  const int chunks = n > kParallelFrom ? omp_get_max_threads() : 1;
  auto chunkBegin = [n, chunks](int t) { return n * t / chunks; };
  std::vector<int64_t> histograms(static_cast<size_t>(chunks) * kBuckets, 0);
  auto histogram = [&](int t, int b) { return histograms[static_cast<size_t>(t) * kBuckets + b]; };
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
  int bucket = kBuckets - 1;
  int64_t above = 0;  // entries in the buckets above `bucket`, all of them winners
  for (;; --bucket) {
    int64_t inBucket = 0;
    for (int t = 0; t < chunks; ++t) inBucket += histogram(t, bucket);
    if (above + inBucket >= count) break;
    above += inBucket;
  }
  // The bucket's keys, each chunk's into its own slice. The stores are unconditional (a key is kept
  // by advancing past it), which spares a mispredicted branch per entry; a chunk stops once its
  // slice is full.
  std::vector<int64_t> slice(chunks + 1, 0);
  for (int t = 0; t < chunks; ++t) slice[t + 1] = slice[t] + histogram(t, bucket);
  std::vector<uint32_t> candidates(slice[chunks]);
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
  for (int t = 0; t < chunks; ++t) {
    uint32_t* out = candidates.data() + slice[t];
    const uint32_t* full = candidates.data() + slice[t + 1];
    for (int64_t i = chunkBegin(t); out < full; ++i) {
      const uint32_t k = key(i);
      *out = k;
      out += static_cast<int>(k >> kShift) == bucket;
    }
  }
  const int64_t need = count - above;  // how many of the bucket's entries are kept, ≥ 1
  std::vector<uint32_t> ranked(candidates);
  std::nth_element(ranked.begin(), ranked.begin() + (need - 1), ranked.end(), std::greater<uint32_t>());
  const uint32_t threshold = ranked[need - 1];

  // Each chunk's winners, from its histogram and its slice: every entry of a higher bucket and its
  // candidates above the threshold, then as many ties at the threshold as are left, lowest indices first.
  std::vector<int64_t> greater(chunks + 1, 0), equal(chunks + 1, 0);
  for (int t = 0; t < chunks; ++t) {
    int64_t g = 0, e = 0;
    for (int b = bucket + 1; b < kBuckets; ++b) g += histogram(t, b);
    for (int64_t c = slice[t]; c < slice[t + 1]; ++c) {
      g += candidates[c] > threshold;
      e += candidates[c] == threshold;
    }
    greater[t + 1] = greater[t] + g;
    equal[t + 1] = equal[t] + e;
  }
  const int64_t equalToTake = count - greater[chunks];
#pragma omp parallel for num_threads(chunks) schedule(static, 1)
  for (int t = 0; t < chunks; ++t) {
    int64_t equalBefore = equal[t];
    int32_t* out = indices.data() + greater[t] + std::min(equal[t], equalToTake);
    const int32_t* full = indices.data() + greater[t + 1] + std::min(equal[t + 1], equalToTake);
    for (int64_t i = chunkBegin(t); out < full; ++i) {
      const uint32_t k = key(i);
      const bool tie = k == threshold;
      *out = static_cast<int32_t>(i);
      out += (k > threshold) | (tie & (equalBefore < equalToTake));
      equalBefore += tie;
    }
  }
}

}  // namespace accordion
