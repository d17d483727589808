// BatchNorm2d on NCHW activations, as torch.nn.BatchNorm2d (see ops/batchnorm2d.h); NHWC ones are
// batchnorm2d_nhwc.cu's.
//
// Launch scheme: every kernel gives each channel `splits` blocks; block b works on channel
// b / splits, on slice b % splits of its N·H·W elements (N runs of H·W contiguous floats, read in
// 16-byte packs when H·W % 4 == 0 and the pointers allow). `splits` makes the C·splits blocks one
// full wave of the device, so that C = 64 still occupies every multiprocessor. A reduction leaves
// one partial per block, in double; the channel's last block to finish (an atomic count per
// channel) merges the channel's partials in a fixed order and finalizes the channel, so there is no
// extra launch and the results do not depend on the order in which blocks ran.
//
// Passes over memory:
//   forwardTraining    statistics: read x;  normalize: read x, write y
//   forwardInference   normalize: read x, write y
//   backward (batch)   sums: read x, dy;  input gradient: read x, dy, write dx
//   backward (fixed)   one pass: read x, dy, write dx, with the sums
//
// Numerics: the statistics are those of x − (one of the channel's values), so that float rounding
// scales with the data's spread, not its offset; the variance comes from Welford/Chan merging (per
// thread in float, pack by pack, then across the block's threads in float, then across blocks in
// double), never from E[x²] − E[x]². The gradient sums Σdy and Σdy·(x − μ) run in float within a
// block and in double across blocks. y = γ/√(var + eps)·(x − μ) + β and the gradients follow
// oneDNN's formulas on the CPU.
#include "ops/batchnorm2d.cuh"
#include "ops/batchnorm2d_relu.h"
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

// An NCHW tensor's channels in packs of kWidth floats: plane (n, c) is planePacks packs from pack
// (n·C + c)·planePacks; each channel has channelPacks = N·planePacks packs (< 2^31), cut in `splits`
// slices of packsPerSplit. A block's kThreads threads step through their slice kThreads packs at a
// time: planesPerStep whole planes and offsetPerStep packs. The divisions are done on the host.
struct ChannelLayout {
  int64_t channels, planePacks, channelPacks, packsPerSplit, planesPerStep, offsetPerStep;
  int splits;
};

ChannelLayout channelLayout(int64_t channels, int64_t planePacks, int64_t channelPacks, int64_t splits) {
  return {channels, planePacks, channelPacks, (channelPacks + splits - 1) / splits, kThreads / planePacks, kThreads % planePacks,
          static_cast<int>(splits)};
}

__device__ __forceinline__ int64_t channelOfBlock(const ChannelLayout& layout) { return blockIdx.x / layout.splits; }

// Calls visit(packIndex) for each of this thread's packs in the block's slice of its channel.
template <typename Visit>
__device__ __forceinline__ void forEachPackOfSlice(const ChannelLayout& layout, Visit visit) {
  const int64_t channel = channelOfBlock(layout), split = blockIdx.x - channel * layout.splits;
  const int64_t begin = split * layout.packsPerSplit;
  const int64_t end = begin + layout.packsPerSplit < layout.channelPacks ? begin + layout.packsPerSplit : layout.channelPacks;
  const int64_t j = begin + threadIdx.x;
  if (j >= end) return;
  // Pack j of the channel is pack `offset` of the plane starting at pack `plane`; both advance
  // without dividing. A counted loop lets the unrolled steps' loads issue together.
  const uint32_t planePacks = static_cast<uint32_t>(layout.planePacks), offsetPerStep = static_cast<uint32_t>(layout.offsetPerStep);
  const uint32_t n = static_cast<uint32_t>(j) / planePacks;
  uint32_t offset = static_cast<uint32_t>(j) - n * planePacks;
  int64_t plane = (n * layout.channels + channel) * layout.planePacks;
  const int64_t planeStride = layout.channels * layout.planePacks, planeAdvance = layout.planesPerStep * planeStride;
  const int steps = static_cast<int>((end - j + kThreads - 1) / kThreads);
#pragma unroll 4
  for (int step = 0; step < steps; ++step) {
    visit(plane + offset);
    offset += offsetPerStep;
    plane += planeAdvance;
    if (offset >= planePacks) offset -= planePacks, plane += planeStride;
  }
}

// Stores thread 0's `partial` as this block's and counts the block in for its channel. True, in
// every thread, for the channel's last block, which then sees all the channel's partials.
template <typename T>
__device__ bool publishPartial(const T& partial, T* partials, unsigned* arrivals, int splits) {
  __shared__ bool last;
  if (threadIdx.x == 0) {
    partials[blockIdx.x] = partial;
    __threadfence();  // the partial is visible device-wide before the block is counted
    const unsigned channel = blockIdx.x / splits;
    last = atomicAdd(&arrivals[channel], 1u) == static_cast<unsigned>(splits - 1);
    if (last) {
      arrivals[channel] = 0;  // ready for the next launch
      __threadfence();
    }
  }
  __syncthreads();
  return last;
}

// Merges the channel's partials (this block is its last, see publishPartial) with the first warp,
// in a fixed order; lane 0 gets the result. Only the first warp may call it.
template <typename T, typename Merge>
__device__ __forceinline__ T mergeChannelPartials(const T* partials, int64_t channel, int splits, Merge merge, T identity) {
  T total = identity;
  for (int s = threadIdx.x; s < splits; s += 32) total = merge(total, loadFromL2(partials + channel * splits + s));
  return warpAllReduce(total, merge);
}

// ---- Statistics ------------------------------------------------------------------------------

template <int kWidth>
__global__ void __launch_bounds__(kThreads) batchStatistics(const float* __restrict__ x, ChannelLayout layout, Moments<double>* partials,
                                                            unsigned* arrivals, float momentum, float* __restrict__ batchMean,
                                                            float* __restrict__ batchVar, float* __restrict__ runningMean,
                                                            float* __restrict__ runningVar) {
  const MergeMoments merge{};
  // Moments of x − pivot, the pivot being one of the channel's values: float rounding then scales
  // with the spread of the data rather than with its distance from 0.
  const float pivot = x[channelOfBlock(layout) * layout.planePacks * kWidth];
  Moments<float> m{0.0f, 0.0f, 0.0f};
  forEachPackOfSlice(layout, [&](int64_t p) {
    Pack<float, kWidth> v = loadPack<kWidth>(x, p);
#pragma unroll
    for (int l = 0; l < kWidth; ++l) v.v[l] -= pivot;
    float sum = 0.0f;
#pragma unroll
    for (int l = 0; l < kWidth; ++l) sum += v.v[l];
    const float mean = sum / kWidth;
    float m2 = 0.0f;
#pragma unroll
    for (int l = 0; l < kWidth; ++l) m2 += (v.v[l] - mean) * (v.v[l] - mean);
    // Chan's merge with the pack, branch-free (the count is positive from the first pack on) so
    // that the unrolled steps' loads issue together; the approximate reciprocal is within 2 ulp.
    m.count += kWidth;
    const float weight = __fdividef(kWidth, m.count), delta = mean - m.mean;
    m.mean += delta * weight;
    m.m2 += m2 + delta * delta * (m.count - kWidth) * weight;
  });
  m = blockReduce(m, merge, Moments<float>{0.0f, 0.0f, 0.0f});
  if (!publishPartial(Moments<double>{m.count, m.mean, m.m2}, partials, arrivals, layout.splits) || threadIdx.x >= 32) return;

  const int64_t channel = channelOfBlock(layout);
  const Moments<double> total = mergeChannelPartials(partials, channel, layout.splits, merge, Moments<double>{0.0, 0.0, 0.0});
  if (threadIdx.x != 0) return;
  finishStatistics(channel, total, pivot, layout.channelPacks * kWidth, momentum, batchMean, batchVar, runningMean, runningVar);
}

template <int kWidth>
__global__ void __launch_bounds__(kThreads) normalize(const float* __restrict__ x, float* __restrict__ y, ChannelLayout layout,
                                                      const float* __restrict__ mean, const float* __restrict__ var,
                                                      const float* __restrict__ gamma, const float* __restrict__ beta, float eps) {
  const int64_t channel = channelOfBlock(layout);
  const float mu = mean[channel], scale = gamma[channel] / sqrtf(var[channel] + eps), bias = beta[channel];
  forEachPackOfSlice(layout, [&](int64_t p) {
    Pack<float, kWidth> v = loadPack<kWidth>(x, p);
#pragma unroll
    for (int l = 0; l < kWidth; ++l) v.v[l] = scale * (v.v[l] - mu) + bias;
    storePack<kWidth>(y, p, v);
  });
}

// ---- Backward --------------------------------------------------------------------------------

// The sums behind dγ = Σ dy·x̂ and dβ = Σ dy; the channel's last block writes those and, with batch
// statistics, the channel's InputGradientTerms. With fixed statistics dx = dy·γ/σ needs no sums and
// is written in the same pass.
template <int kWidth, bool kFixedStatistics>
__global__ void __launch_bounds__(kThreads) backwardSums(const float* __restrict__ x, const float* __restrict__ dy, float* __restrict__ dx,
                                                         ChannelLayout layout, const float* __restrict__ mean,
                                                         const float* __restrict__ var, const float* __restrict__ gamma, float eps,
                                                         GradientSums<double>* partials, unsigned* arrivals, float* __restrict__ dGamma,
                                                         float* __restrict__ dBeta, InputGradientTerms* __restrict__ terms) {
  const int64_t channel = channelOfBlock(layout);
  const float mu = mean[channel], invStd = 1.0f / sqrtf(var[channel] + eps), scale = gamma[channel] * invStd;
  GradientSums<float> s{0.0f, 0.0f};
  forEachPackOfSlice(layout, [&](int64_t p) {
    const Pack<float, kWidth> xv = loadPack<kWidth>(x, p);
    Pack<float, kWidth> g = loadPack<kWidth>(dy, p);
#pragma unroll
    for (int l = 0; l < kWidth; ++l) {
      s.dy += g.v[l];
      s.dyCentered += g.v[l] * (xv.v[l] - mu);
    }
    if constexpr (kFixedStatistics) {
#pragma unroll
      for (int l = 0; l < kWidth; ++l) g.v[l] *= scale;
      storePack<kWidth>(dx, p, g);
    }
  });
  const AddSums add{};
  s = blockReduce(s, add, GradientSums<float>{0.0f, 0.0f});
  if (!publishPartial(GradientSums<double>{s.dy, s.dyCentered}, partials, arrivals, layout.splits) || threadIdx.x >= 32) return;

  const GradientSums<double> total = mergeChannelPartials(partials, channel, layout.splits, add, GradientSums<double>{0.0, 0.0});
  if (threadIdx.x != 0) return;
  finishGradients<kFixedStatistics>(channel, total, invStd, scale, layout.channelPacks * kWidth, dGamma, dBeta, terms);
}

template <int kWidth>
__global__ void __launch_bounds__(kThreads) inputGradient(const float* __restrict__ x, const float* __restrict__ dy,
                                                          float* __restrict__ dx, ChannelLayout layout, const float* __restrict__ mean,
                                                          const InputGradientTerms* __restrict__ terms) {
  const int64_t channel = channelOfBlock(layout);
  const float mu = mean[channel];
  const InputGradientTerms t = terms[channel];
  forEachPackOfSlice(layout, [&](int64_t p) {
    const Pack<float, kWidth> xv = loadPack<kWidth>(x, p);
    Pack<float, kWidth> g = loadPack<kWidth>(dy, p);
#pragma unroll
    for (int l = 0; l < kWidth; ++l) g.v[l] = (g.v[l] - t.meanDy - (xv.v[l] - mu) * t.slope) * t.scale;
    storePack<kWidth>(dx, p, g);
  });
}

// ---- The op ----------------------------------------------------------------------------------

class CudaBatchNorm2d : public BatchNorm2dOp {
 public:
  CudaBatchNorm2d(CudaBackend& backend, const BatchNormSpec& spec) : backend_(backend), spec_(spec) {
    if (spec.batch <= 0 || spec.channels <= 0 || spec.height <= 0 || spec.width <= 0)
      throw invalidArgument("BatchNorm2d on an empty input " + shapeString(spec.shape()));
    if (spec.batch * spec.height * spec.width > INT32_MAX || spec.channels > INT32_MAX)
      throw invalidArgument("BatchNorm2d on " + shapeString(spec.shape()) +
                            ": the CUDA kernels take fewer than 2^31 elements per channel");
    const int device = backend.device().index;
    const int64_t hw = spec.height * spec.width;
    singles_ = layoutFor<1>(hw, device);
    if (hw % 4 == 0) packs_ = layoutFor<4>(hw / 4, device);
    const int64_t splits = std::max(singles_.splits, packs_.splits);
    partials_ = backend.allocate(static_cast<size_t>(spec.channels * splits) * sizeof(Moments<double>));
    arrivals_ = backend.allocate(static_cast<size_t>(spec.channels) * sizeof(unsigned));
    terms_ = backend.allocate(static_cast<size_t>(spec.channels) * sizeof(InputGradientTerms));
    check(cudaMemsetAsync(arrivals_.get(), 0, static_cast<size_t>(spec.channels) * sizeof(unsigned), backend.stream()), "cudaMemsetAsync");
  }

  void forwardTraining(const float* x, const float* gamma, const float* beta, float* y, float* batchMean, float* batchVar,
                       float* runningMean, float* runningVar) override {
    if (packed(x, y))
      train<4>(packs_, x, gamma, beta, y, batchMean, batchVar, runningMean, runningVar);
    else
      train<1>(singles_, x, gamma, beta, y, batchMean, batchVar, runningMean, runningVar);
  }

  void forwardInference(const float* x, const float* gamma, const float* beta, const float* mean, const float* var,
                        float* y) override {
    if (packed(x, y))
      launchNormalize<4>(packs_, x, gamma, beta, mean, var, y);
    else
      launchNormalize<1>(singles_, x, gamma, beta, mean, var, y);
  }

  void backward(const float* x, const float* dy, const float* gamma, const float* beta, const float* mean, const float* var,
                bool batchStatistics, float* dx, float* dGamma, float* dBeta) override {
    if (packed(x, dy, dx))
      launchBackward<4>(packs_, x, dy, gamma, mean, var, batchStatistics, dx, dGamma, dBeta);
    else
      launchBackward<1>(singles_, x, dy, gamma, mean, var, batchStatistics, dx, dGamma, dBeta);
  }

 private:
  // The layout in packs of kWidth, with as many splits per channel as fill the device in one wave
  // for the hungriest of the kernels, and at least a pack per thread.
  template <int kWidth>
  ChannelLayout layoutFor(int64_t planePacks, int device) const {
    const int resident = std::min({residentBlocks(batchStatistics<kWidth>, device), residentBlocks(normalize<kWidth>, device),
                                   residentBlocks(backwardSums<kWidth, false>, device), residentBlocks(backwardSums<kWidth, true>, device),
                                   residentBlocks(inputGradient<kWidth>, device)});
    const int64_t channelPacks = spec_.batch * planePacks;
    const int64_t splits = std::max<int64_t>(std::min<int64_t>(resident / spec_.channels, channelPacks / kThreads), 1);
    return channelLayout(spec_.channels, planePacks, channelPacks, splits);
  }

  template <typename... Pointers>
  bool packed(const Pointers*... data) const {
    return packs_.planePacks > 0 && (packable(data) && ...);
  }

  unsigned blocks(const ChannelLayout& layout) const { return static_cast<unsigned>(layout.channels * layout.splits); }

  template <int kWidth>
  void train(const ChannelLayout& layout, const float* x, const float* gamma, const float* beta, float* y, float* batchMean,
             float* batchVar, float* runningMean, float* runningVar) {
    batchStatistics<kWidth><<<blocks(layout), kThreads, 0, backend_.stream()>>>(x, layout, static_cast<Moments<double>*>(partials_.get()),
                                                                               static_cast<unsigned*>(arrivals_.get()), spec_.momentum,
                                                                               batchMean, batchVar, runningMean, runningVar);
    checkLaunch("batchNorm2d statistics");
    launchNormalize<kWidth>(layout, x, gamma, beta, batchMean, batchVar, y);
  }

  template <int kWidth>
  void launchNormalize(const ChannelLayout& layout, const float* x, const float* gamma, const float* beta, const float* mean,
                       const float* var, float* y) {
    normalize<kWidth><<<blocks(layout), kThreads, 0, backend_.stream()>>>(x, y, layout, mean, var, gamma, beta, spec_.eps);
    checkLaunch("batchNorm2d normalize");
  }

  template <int kWidth>
  void launchBackward(const ChannelLayout& layout, const float* x, const float* dy, const float* gamma, const float* mean,
                      const float* var, bool batchStatistics, float* dx, float* dGamma, float* dBeta) {
    auto* partials = static_cast<GradientSums<double>*>(partials_.get());
    auto* arrivals = static_cast<unsigned*>(arrivals_.get());
    auto* terms = static_cast<InputGradientTerms*>(terms_.get());
    const cudaStream_t stream = backend_.stream();
    if (!batchStatistics) {
      backwardSums<kWidth, true><<<blocks(layout), kThreads, 0, stream>>>(x, dy, dx, layout, mean, var, gamma, spec_.eps, partials,
                                                                        arrivals, dGamma, dBeta, terms);
      checkLaunch("batchNorm2d backward");
      return;
    }
    backwardSums<kWidth, false><<<blocks(layout), kThreads, 0, stream>>>(x, dy, dx, layout, mean, var, gamma, spec_.eps, partials,
                                                                       arrivals, dGamma, dBeta, terms);
    checkLaunch("batchNorm2d backward sums");
    inputGradient<kWidth><<<blocks(layout), kThreads, 0, stream>>>(x, dy, dx, layout, mean, terms);
    checkLaunch("batchNorm2d input gradient");
  }

  CudaBackend& backend_;
  BatchNormSpec spec_;
  ChannelLayout singles_{}, packs_{};  // packs_.planePacks == 0 when H·W % 4 != 0
  // Scratch: a partial per block (Moments<double> or GradientSums<double>), the per-channel
  // arrival counts (zero between launches), the per-channel InputGradientTerms.
  std::shared_ptr<void> partials_, arrivals_, terms_;
};

}  // namespace

std::unique_ptr<BatchNorm2dOp> CudaBackend::batchNorm2d(const BatchNormSpec& spec) {
  if (spec.relu) {
    BatchNormSpec plain = spec;
    plain.relu = false;
    return std::make_unique<ReluAfterBatchNorm>(*this, spec, batchNorm2d(plain));
  }
  if (channelsLast()) return channelsLastBatchNorm2d(*this, spec);
  return std::make_unique<CudaBatchNorm2d>(*this, spec);
}

}  // namespace accordion::cuda
