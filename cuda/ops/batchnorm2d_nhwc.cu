// BatchNorm2d on NHWC activations, as torch.nn.BatchNorm2d (see ops/batchnorm2d.h): the tensor is a
// (P, C) matrix of P = N·H·W rows of C contiguous channels.
//
// Launch scheme: a block of 32 × 8 threads covers a tile of 32 channels (grid x) and a slice of the
// rows (grid y): lane l works on channel 32·tile + l, row group g on the slice's rows g, g + 8, …,
// so each warp reads one row's 32 neighbouring channels, one 128-byte line, at a time. The slices
// make the tiles × slices blocks one wave of the device. A reduction merges the block's 8 row
// groups per channel in a fixed order and leaves one partial per (slice, channel), in double; the
// tile's last block to finish (an atomic count per tile) merges every slice's partials in a fixed
// order and finalizes the tile's channels, so the results do not depend on the order in which
// blocks ran.
//
// Passes over memory, as on NCHW: the statistics read x, normalizing reads x and writes y; the
// backward's sums read x and dy, its input gradient reads them again and writes dx (fixed
// statistics: one pass).
//
// Numerics, as on NCHW: the moments of x − (the channel's value in row 0) by Welford's update per
// thread in float and Chan's merge in double after; the gradient sums in float per thread, in
// double after.
#include <algorithm>

#include "ops/batchnorm2d.cuh"
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

constexpr int kLanes = 32, kRowGroups = 8;  // a block: 32 channels × 8 row groups (kThreads threads)
static_assert(kLanes * kRowGroups == kThreads, "a block has kThreads threads");

// Rows (P), channels (C) and the row slices of the grid's y dimension.
struct RowSlices {
  int64_t rows;
  int channels;
  int64_t rowsPerSlice;
  int slices;
};

__device__ __forceinline__ int channelOfThread() { return static_cast<int>(blockIdx.x) * kLanes + static_cast<int>(threadIdx.x); }

// Calls visit(index) for the elements of this thread's channel in its row group's rows of the
// block's slice; nothing for a lane past the last channel.
template <typename Visit>
__device__ __forceinline__ void forEachRowOfSlice(const RowSlices& s, Visit visit) {
  const int channel = channelOfThread();
  if (channel >= s.channels) return;
  const int64_t begin = int64_t{blockIdx.y} * s.rowsPerSlice;
  const int64_t end = begin + s.rowsPerSlice < s.rows ? begin + s.rowsPerSlice : s.rows;
#pragma unroll 4
  for (int64_t r = begin + threadIdx.y; r < end; r += kRowGroups) visit(r * s.channels + channel);
}

// Every thread's `value` merged per channel over the block's row groups (in row-group order) into
// the block's partial for (slice, channel); in the tile's last block to arrive, every slice's
// partials merged (each row group a fixed share of the slices, then the row groups in order) and
// finish(channel, total) called by row group 0's threads. Every thread of the block must call it.
template <typename T, typename Merge, typename Finish>
__device__ void reduceChannels(T value, T identity, Merge merge, T* partials, unsigned* arrivals, const RowSlices& s, Finish finish) {
  __shared__ T groups[kRowGroups][kLanes];
  __shared__ bool last;
  const int lane = threadIdx.x, group = threadIdx.y, channel = channelOfThread();
  const bool owns = channel < s.channels;
  groups[group][lane] = value;
  __syncthreads();
  if (group == 0 && owns) {
    T total = groups[0][lane];
    for (int g = 1; g < kRowGroups; ++g) total = merge(total, groups[g][lane]);
    partials[int64_t{blockIdx.y} * s.channels + channel] = total;
    __threadfence();  // the partial is visible device-wide before the block is counted
  }
  __syncthreads();
  if (lane == 0 && group == 0) {
    last = atomicAdd(&arrivals[blockIdx.x], 1u) == static_cast<unsigned>(s.slices - 1);
    if (last) {
      arrivals[blockIdx.x] = 0;  // ready for the next launch
      __threadfence();
    }
  }
  __syncthreads();
  if (!last) return;
  T total = identity;
  if (owns)
    for (int slice = group; slice < s.slices; slice += kRowGroups) total = merge(total, loadFromL2(partials + int64_t{slice} * s.channels + channel));
  groups[group][lane] = total;  // its last reads were before the second barrier
  __syncthreads();
  if (group != 0 || !owns) return;
  for (int g = 1; g < kRowGroups; ++g) total = merge(total, groups[g][lane]);
  finish(channel, total);
}

// ---- Statistics ------------------------------------------------------------------------------

__global__ void __launch_bounds__(kThreads) batchStatistics(const float* __restrict__ x, RowSlices s, Moments<double>* partials,
                                                            unsigned* arrivals, float momentum, float* __restrict__ batchMean,
                                                            float* __restrict__ batchVar, float* __restrict__ runningMean,
                                                            float* __restrict__ runningVar) {
  const int channel = channelOfThread();
  const float pivot = channel < s.channels ? x[channel] : 0.0f;  // row 0's value
  Moments<float> m{0.0f, 0.0f, 0.0f};
  forEachRowOfSlice(s, [&](int64_t i) {
    const float v = x[i] - pivot;
    m.count += 1.0f;
    const float delta = v - m.mean;
    m.mean += __fdividef(delta, m.count);  // within 2 ulp
    m.m2 += delta * (v - m.mean);
  });
  reduceChannels(Moments<double>{m.count, m.mean, m.m2}, Moments<double>{0.0, 0.0, 0.0}, MergeMoments{}, partials, arrivals, s,
                 [&](int c, const Moments<double>& total) {
                   finishStatistics(c, total, pivot, s.rows, momentum, batchMean, batchVar, runningMean, runningVar);
                 });
}

__global__ void __launch_bounds__(kThreads) normalize(const float* __restrict__ x, float* __restrict__ y, RowSlices s,
                                                      const float* __restrict__ mean, const float* __restrict__ var,
                                                      const float* __restrict__ gamma, const float* __restrict__ beta, float eps) {
  const int channel = channelOfThread();
  if (channel >= s.channels) return;
  const float mu = mean[channel], scale = gamma[channel] / sqrtf(var[channel] + eps), bias = beta[channel];
  forEachRowOfSlice(s, [&](int64_t i) { y[i] = scale * (x[i] - mu) + bias; });
}

// ---- Backward --------------------------------------------------------------------------------

// The sums behind dγ and dβ, finished by the tile's last block (finishGradients); with fixed
// statistics dx = dy·γ/σ is written in the same pass.
template <bool kFixedStatistics>
__global__ void __launch_bounds__(kThreads) backwardSums(const float* __restrict__ x, const float* __restrict__ dy, float* __restrict__ dx,
                                                         RowSlices s, const float* __restrict__ mean, const float* __restrict__ var,
                                                         const float* __restrict__ gamma, float eps, GradientSums<double>* partials,
                                                         unsigned* arrivals, float* __restrict__ dGamma, float* __restrict__ dBeta,
                                                         InputGradientTerms* __restrict__ terms) {
  const int channel = channelOfThread();
  const bool owns = channel < s.channels;
  const float mu = owns ? mean[channel] : 0.0f, invStd = owns ? 1.0f / sqrtf(var[channel] + eps) : 0.0f;
  const float scale = owns ? gamma[channel] * invStd : 0.0f;
  GradientSums<float> sums{0.0f, 0.0f};
  forEachRowOfSlice(s, [&](int64_t i) {
    const float g = dy[i];
    sums.dy += g;
    sums.dyCentered += g * (x[i] - mu);
    if constexpr (kFixedStatistics) dx[i] = g * scale;
  });
  reduceChannels(GradientSums<double>{sums.dy, sums.dyCentered}, GradientSums<double>{0.0, 0.0}, AddSums{}, partials, arrivals, s,
                 [&](int c, const GradientSums<double>& total) {
                   finishGradients<kFixedStatistics>(c, total, invStd, scale, s.rows, dGamma, dBeta, terms);
                 });
}

__global__ void __launch_bounds__(kThreads) inputGradient(const float* __restrict__ x, const float* __restrict__ dy,
                                                          float* __restrict__ dx, RowSlices s, const float* __restrict__ mean,
                                                          const InputGradientTerms* __restrict__ terms) {
  const int channel = channelOfThread();
  if (channel >= s.channels) return;
  const float mu = mean[channel];
  const InputGradientTerms t = terms[channel];
  forEachRowOfSlice(s, [&](int64_t i) { dx[i] = (dy[i] - t.meanDy - (x[i] - mu) * t.slope) * t.scale; });
}

// ---- The op ----------------------------------------------------------------------------------

class ChannelsLastBatchNorm2d : public BatchNorm2dOp {
 public:
  ChannelsLastBatchNorm2d(CudaBackend& backend, const BatchNormSpec& spec) : backend_(backend), spec_(spec) {
    if (spec.batch <= 0 || spec.channels <= 0 || spec.height <= 0 || spec.width <= 0)
      throw invalidArgument("BatchNorm2d on an empty input " + shapeString(spec.shape()));
    if (spec.channels > INT32_MAX - kLanes)
      throw invalidArgument("BatchNorm2d on " + shapeString(spec.shape()) + ": the CUDA kernels take fewer than 2^31 channels");
    const int device = backend.device().index;
    const int resident = std::min({residentBlocks(batchStatistics, device), residentBlocks(normalize, device),
                                   residentBlocks(backwardSums<false>, device), residentBlocks(backwardSums<true>, device),
                                   residentBlocks(inputGradient, device)});
    const int64_t rows = spec.batch * spec.height * spec.width, tiles = (spec.channels + kLanes - 1) / kLanes;
    // One wave of blocks, each thread of a slice still taking at least 16 rows.
    const int64_t slices = std::clamp<int64_t>(std::min<int64_t>(resident / tiles, rows / (kRowGroups * 16)), 1, 65535);
    const int64_t rowsPerSlice = (rows + slices - 1) / slices;
    slices_ = {rows, static_cast<int>(spec.channels), rowsPerSlice, static_cast<int>((rows + rowsPerSlice - 1) / rowsPerSlice)};
    grid_ = dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(slices_.slices));
    partials_ = backend.allocate(static_cast<size_t>(spec.channels) * slices_.slices * sizeof(Moments<double>));
    arrivals_ = backend.allocate(static_cast<size_t>(tiles) * sizeof(unsigned));
    terms_ = backend.allocate(static_cast<size_t>(spec.channels) * sizeof(InputGradientTerms));
    check(cudaMemsetAsync(arrivals_.get(), 0, static_cast<size_t>(tiles) * sizeof(unsigned), backend.stream()), "cudaMemsetAsync");
  }

  void forwardTraining(const float* x, const float* gamma, const float* beta, float* y, float* batchMean, float* batchVar,
                       float* runningMean, float* runningVar) override {
    batchStatistics<<<grid_, block(), 0, backend_.stream()>>>(x, slices_, static_cast<Moments<double>*>(partials_.get()), arrivals(),
                                                              spec_.momentum, batchMean, batchVar, runningMean, runningVar);
    checkLaunch("batchNorm2d statistics (NHWC)");
    forwardInference(x, gamma, beta, batchMean, batchVar, y);
  }

  void forwardInference(const float* x, const float* gamma, const float* beta, const float* mean, const float* var,
                        float* y) override {
    normalize<<<grid_, block(), 0, backend_.stream()>>>(x, y, slices_, mean, var, gamma, beta, spec_.eps);
    checkLaunch("batchNorm2d normalize (NHWC)");
  }

  void backward(const float* x, const float* dy, const float* gamma, const float* beta, const float* mean, const float* var,
                bool batchStatistics, float* dx, float* dGamma, float* dBeta) override {
    auto* partials = static_cast<GradientSums<double>*>(partials_.get());
    auto* terms = static_cast<InputGradientTerms*>(terms_.get());
    const cudaStream_t stream = backend_.stream();
    if (!batchStatistics) {
      backwardSums<true><<<grid_, block(), 0, stream>>>(x, dy, dx, slices_, mean, var, gamma, spec_.eps, partials, arrivals(), dGamma,
                                                        dBeta, terms);
      checkLaunch("batchNorm2d backward (NHWC)");
      return;
    }
    backwardSums<false><<<grid_, block(), 0, stream>>>(x, dy, dx, slices_, mean, var, gamma, spec_.eps, partials, arrivals(), dGamma,
                                                       dBeta, terms);
    checkLaunch("batchNorm2d backward sums (NHWC)");
    inputGradient<<<grid_, block(), 0, stream>>>(x, dy, dx, slices_, mean, terms);
    checkLaunch("batchNorm2d input gradient (NHWC)");
  }

 private:
  static dim3 block() { return dim3(kLanes, kRowGroups); }
  unsigned* arrivals() const { return static_cast<unsigned*>(arrivals_.get()); }

  CudaBackend& backend_;
  BatchNormSpec spec_;
  RowSlices slices_{};
  dim3 grid_;
  // Scratch: a partial per (slice, channel) (Moments<double> or GradientSums<double>), the per-tile
  // arrival counts (zero between launches), the per-channel InputGradientTerms.
  std::shared_ptr<void> partials_, arrivals_, terms_;
};

}  // namespace

std::unique_ptr<BatchNorm2dOp> channelsLastBatchNorm2d(CudaBackend& backend, const BatchNormSpec& spec) {
  return std::make_unique<ChannelsLastBatchNorm2d>(backend, spec);
}

}  // namespace accordion::cuda
