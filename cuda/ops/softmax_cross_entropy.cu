// Mean softmax cross-entropy over the rows, its gradient, and the rows predicted right.
//
// Two launches. The first gives each row a team of threads: a warp for up to kWarpRowClasses
// classes (8 rows a block), else a block of kRowBlockThreads (the language models' tens of
// thousands of classes, with few enough rows at once that a row is still in L2 when read again).
// It reads the row twice: once for the maximum, its first position and Σ exp(z − max) together
// (the sum rescaled whenever the maximum grows), once to write the gradient; the row's loss (in
// double) and hit go to scratch. The second launch, one block, sums those in a fixed order, so
// the statistics are deterministic.
//
// As on the CPU: the arg-max is the first maximum (strict >), NaN logits never win it, and a NaN in
// z[0] makes 0 the prediction; a NaN logit, a +∞ one or a row of −∞ makes the row's sum, hence its
// gradient and loss, NaN; exponentials and their sum are in float, the log-sum in double. Labels are validated
// on the host before; should one lie outside [0, k) anyway, nothing is read out of range: the row
// gets no one-hot term in its gradient, counts as wrong, and its loss (hence the mean) is NaN.
#include <cmath>

#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

constexpr int64_t kWarpRowClasses = 256;
constexpr int kRowBlockThreads = 1024;
constexpr int32_t kNoIndex = INT32_MAX;  // no element above −∞

// A run of a row's logits: its maximum, the first position of it, and Σ exp(z − max).
struct Softmax {
  float max, sum;
  int32_t index;
};

__device__ __forceinline__ float rescaled(float sum, float max, float newMax) {
  return max == newMax ? sum : __fmul_rn(sum, expf(max - newMax));
}

// Merges two runs; symmetric to the bit (no contraction into FMAs), so every lane of a butterfly
// gets the same result. Among equal maxima the lower index wins: the first maximum whatever the
// order of merging.
struct MergeSoftmax {
  __device__ Softmax operator()(const Softmax& a, const Softmax& b) const {
    const float max = fmaxf(a.max, b.max);
    const int32_t index = a.max == b.max ? min(a.index, b.index) : a.max > b.max ? a.index : b.index;
    return {max, __fadd_rn(rescaled(a.sum, a.max, max), rescaled(b.sum, b.max, max)), index};
  }
};

// All threads of a row's team (a warp, or the block) get the merged value.
template <int kTeam, typename T, typename Merge>
__device__ __forceinline__ T teamAllReduce(T value, Merge merge, T identity) {
  if constexpr (kTeam == 32)
    return warpAllReduce(value, merge);
  else
    return blockAllReduce(value, merge, identity);
}

template <int kTeam>
constexpr int kBlockThreads = kTeam == 32 ? kThreads : kTeam;

template <int kTeam>
__global__ void __launch_bounds__(kBlockThreads<kTeam>)
    crossEntropyRows(const float* __restrict__ logits, const int32_t* __restrict__ labels, int64_t n, int64_t k, float invN,
                     float* __restrict__ grad, double* __restrict__ rowLoss, int32_t* __restrict__ rowHit) {
  static_assert(kTeam == 32 || kTeam == kRowBlockThreads, "a row's team is a warp or a whole block");
  const int64_t row = int64_t{blockIdx.x} * (kBlockThreads<kTeam> / kTeam) + threadIdx.x / kTeam;
  if (row >= n) return;  // whole warps only: a block team always has its row
  const int lane = threadIdx.x % kTeam;
  const float* z = logits + row * k;
  float* g = grad + row * k;

  Softmax s{-INFINITY, 0.0f, kNoIndex};
  for (int64_t j = lane; j < k; j += kTeam) {
    const float v = z[j];
    if (v > s.max) {
      s = {v, __fadd_rn(rescaled(s.sum, s.max, v), 1.0f), static_cast<int32_t>(j)};
    } else if (v != -INFINITY) {  // exp(−∞ − max) adds 0, unless max is −∞ too, where it would add NaN
      s.sum += expf(v - s.max);
    }
  }
  s = teamAllReduce<kTeam>(s, MergeSoftmax{}, Softmax{-INFINITY, 0.0f, kNoIndex});
  const float maxZ = s.max;
  // An infinite maximum (+∞, or −∞ for a row of −∞) puts exp(±∞ ∓ ∞) = NaN in the CPU's Σ exp(z − max).
  const float sum = isinf(maxZ) ? NAN : s.sum;

  const int32_t label = labels[row];
  const float scale = invN / sum;
  // The row's last read and the gradient go first out of L2, which keeps the rows still to be
  // read again.
  for (int64_t j = lane; j < k; j += kTeam) {
    float v = __fmul_rn(expf(__ldcs(z + j) - maxZ), scale);  // rounded before the one-hot term, as on the CPU
    if (j == label) v -= invN;
    __stcs(g + j, v);
  }

  if (lane == 0) {
    const bool valid = label >= 0 && label < k;
    const int32_t predicted = s.index == kNoIndex || isnan(z[0]) ? 0 : s.index;
    rowLoss[row] = valid ? log(static_cast<double>(sum)) - static_cast<double>(z[label] - maxZ) : NAN;
    rowHit[row] = valid && predicted == label;
  }
}

struct Totals {
  double loss, hits;
};

struct AddTotals {
  __device__ Totals operator()(const Totals& a, const Totals& b) const { return {a.loss + b.loss, a.hits + b.hits}; }
};

__global__ void __launch_bounds__(kThreads) crossEntropyStats(const double* __restrict__ rowLoss, const int32_t* __restrict__ rowHit,
                                                              int64_t n, double* __restrict__ stats) {
  Totals t{0.0, 0.0};
  for (int64_t r = threadIdx.x; r < n; r += blockDim.x) t.loss += rowLoss[r], t.hits += rowHit[r];
  t = blockReduce(t, AddTotals{}, Totals{0.0, 0.0});
  if (threadIdx.x == 0) {
    stats[0] = t.loss / static_cast<double>(n);
    stats[1] = t.hits;
  }
}

}  // namespace

void CudaBackend::softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t k, float* gradLogits,
                                      double* stats) {
  if (k < 1 || k > INT32_MAX) throw invalidArgument("softmax cross-entropy over " + std::to_string(k) + " classes");
  // Per-row results until the second launch; freed in stream order after it.
  std::shared_ptr<void> scratch = allocate(static_cast<size_t>(n) * (sizeof(double) + sizeof(int32_t)));
  auto* rowLoss = static_cast<double*>(scratch.get());
  auto* rowHit = reinterpret_cast<int32_t*>(rowLoss + n);
  if (n > 0) {
    const float invN = 1.0f / static_cast<float>(n);
    if (k <= kWarpRowClasses) {
      constexpr int64_t rowsPerBlock = kThreads / 32;
      crossEntropyRows<32><<<static_cast<unsigned>((n + rowsPerBlock - 1) / rowsPerBlock), kThreads, 0, stream()>>>(
          logits, labels, n, k, invN, gradLogits, rowLoss, rowHit);
    } else {
      crossEntropyRows<kRowBlockThreads><<<static_cast<unsigned>(n), kRowBlockThreads, 0, stream()>>>(logits, labels, n, k, invN,
                                                                                                     gradLogits, rowLoss, rowHit);
    }
    checkLaunch("softmaxCrossEntropy");
  }
  crossEntropyStats<<<1, kThreads, 0, stream()>>>(rowLoss, rowHit, n, stats);
  checkLaunch("softmaxCrossEntropy statistics");
}

}  // namespace accordion::cuda
