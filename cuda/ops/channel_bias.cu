// The kernels of ChannelBias (channel_bias.cuh): blockIdx.y picks channels, blockIdx.x a slice of
// each channel's elements; the gradient sums in float per thread, in double across the block and
// across slices.
#include <algorithm>

#include "core/check.h"
#include "ops/channel_bias.cuh"

namespace accordion::cuda {

namespace {


// Blocks per launch that keep the largest GPUs busy for a couple of waves (H100: 132 SMs × 8
// resident blocks of 256 threads); more only adds partial sums.
constexpr int64_t kTargetBlocks = 2048;
// Loads each thread issues before using them, so enough bytes are in flight to saturate memory.
constexpr int kUnroll = 4;
constexpr int kWarp = 32;
constexpr unsigned kFullWarp = 0xffffffffu;
// The grid's y dimension (channels) is at most this.
constexpr int kMaxGridY = 65535;

// Element j = n·P + p of one channel c of an NCHW tensor (N, C, P = H·W), at index n·C·P + c·P + p,
// moved on by a fixed step with additions only: a division per element would cost more than the
// memory access it addresses. An NHWC tensor is the NCHW tensor of N·H·W images with P = 1.
class ChannelCursor {
 public:
  __device__ ChannelCursor(int64_t j, int channel, int channels, int plane, int step)
      : plane_(plane),
        offset_(static_cast<int>(j % plane)),
        stepOffset_(step % plane),
        imageStride_(int64_t{channels} * plane),
        stepIndex_(int64_t{step / plane} * imageStride_ + step % plane),
        index_(j / plane * imageStride_ + int64_t{channel} * plane + offset_) {}

  __device__ int64_t index() const { return index_; }

  __device__ void advance() {
    offset_ += stepOffset_;
    index_ += stepIndex_;
    if (offset_ >= plane_) {  // into the next image: skip the other channels' planes
      offset_ -= plane_;
      index_ += imageStride_ - plane_;
    }
  }

 private:
  int plane_, offset_, stepOffset_;
  int64_t imageStride_, stepIndex_, index_;
};

// This thread's share of one block's slice [blockIdx.x·perBlock, +perBlock) of a channel's
// perChannel elements, the threads of the block taking every blockDim.x-th element.
struct SliceShare {
  int64_t first, count;
};

__device__ SliceShare sliceShare(int64_t perChannel, int64_t perBlock) {
  const int64_t begin = int64_t{blockIdx.x} * perBlock, end = min(perChannel, begin + perBlock);
  const int64_t first = begin + threadIdx.x;
  return {first, first < end ? (end - first + blockDim.x - 1) / blockDim.x : 0};
}

// y (N, C, P) += bias[c] per channel; blockIdx.y picks channels, blockIdx.x a slice of each.
__global__ void addChannelBias(float* __restrict__ y, const float* __restrict__ bias, int channels, int plane, int64_t perChannel,
                               int64_t perBlock) {
  for (int c = blockIdx.y; c < channels; c += gridDim.y) {
    const float b = bias[c];
    const SliceShare share = sliceShare(perChannel, perBlock);
    if (share.count == 0) continue;
    ChannelCursor at(share.first, c, channels, plane, blockDim.x);
    int64_t left = share.count;
    for (; left >= kUnroll; left -= kUnroll) {
      int64_t index[kUnroll];
      float value[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        index[u] = at.index();
        at.advance();
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) value[u] = y[index[u]];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) y[index[u]] = value[u] + b;
    }
    for (; left > 0; --left) {
      y[at.index()] += b;
      at.advance();
    }
  }
}

// The sum of every thread's value as a fixed tree (the same bits on every run), in thread 0.
__device__ double blockSum(double value) {
  __shared__ double warpSums[kThreads / kWarp];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value += __shfl_down_sync(kFullWarp, value, offset);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) warpSums[warp] = value;
  __syncthreads();
  value = 0;
  if (warp == 0) {
    if (lane < static_cast<int>(blockDim.x / kWarp)) value = warpSums[lane];
    for (int offset = kWarp / 2; offset > 0; offset /= 2) value += __shfl_down_sync(kFullWarp, value, offset);
  }
  __syncthreads();  // warpSums is reused for the block's next channel
  return value;
}

// Σ over N·P of one slice of each channel of dy (N, C, P): in float per thread (a few dozen
// elements), in double across the block. A single slice per channel is the whole sum, written to
// dBias; otherwise partials (C, slices) hold one sum per slice for finishChannelSums.
__global__ void sumChannelSlices(const float* __restrict__ dy, int channels, int plane, int64_t perChannel, int64_t perBlock,
                                 double* __restrict__ partials, float* __restrict__ dBias) {
  for (int c = blockIdx.y; c < channels; c += gridDim.y) {
    const SliceShare share = sliceShare(perChannel, perBlock);
    float sum = 0;
    if (share.count > 0) {
      ChannelCursor at(share.first, c, channels, plane, blockDim.x);
      int64_t left = share.count;
      for (; left >= kUnroll; left -= kUnroll) {
        int64_t index[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          index[u] = at.index();
          at.advance();
        }
        float value[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) value[u] = dy[index[u]];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) sum += value[u];
      }
      for (; left > 0; --left) {
        sum += dy[at.index()];
        at.advance();
      }
    }
    const double total = blockSum(sum);
    if (threadIdx.x == 0) {
      if (gridDim.x == 1)
        dBias[c] = static_cast<float>(total);
      else
        partials[int64_t{c} * gridDim.x + blockIdx.x] = total;
    }
  }
}

// dBias[c] = Σ_s partials[c, s] in double, one warp per channel.
__global__ void finishChannelSums(const double* __restrict__ partials, int slices, int channels, float* __restrict__ dBias) {
  const int lane = threadIdx.x % kWarp;
  const int warps = gridDim.x * blockDim.x / kWarp;
  // Whole warps share a channel, so the loop and the shuffles stay warp-uniform.
  for (int c = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp; c < channels; c += warps) {
    double sum = 0;
    for (int s = lane; s < slices; s += kWarp) sum += partials[int64_t{c} * slices + s];
    for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_down_sync(kFullWarp, sum, offset);
    if (lane == 0) dBias[c] = static_cast<float>(sum);
  }
}

}  // namespace

ChannelBias::ChannelBias(CudaBackend& backend, int64_t images, int channels, int plane)
    : backend_(backend), channels_(channels), plane_(plane), perChannel_(images * plane) {
  // Slices per channel: enough blocks to fill the GPU, each thread still summing several elements,
  // and then slices of equal length.
  const int64_t byWork = (perChannel_ + kThreads * kUnroll - 1) / (kThreads * kUnroll);
  const int64_t byDevice = (kTargetBlocks + channels_ - 1) / channels_;
  const int64_t slices = std::max<int64_t>(1, std::min(byWork, byDevice));
  perBlock_ = (perChannel_ + slices - 1) / slices;
  slices_ = static_cast<int>((perChannel_ + perBlock_ - 1) / perBlock_);
  if (slices_ > 1) partials_ = backend.allocate(static_cast<size_t>(slices_) * channels_ * sizeof(double));
}

dim3 ChannelBias::grid() const { return dim3(static_cast<unsigned>(slices_), static_cast<unsigned>(std::min(channels_, kMaxGridY))); }

void ChannelBias::add(float* y, const float* bias) {
  addChannelBias<<<grid(), kThreads, 0, backend_.stream()>>>(y, bias, channels_, plane_, perChannel_, perBlock_);
  checkLaunch("addChannelBias");
}

void ChannelBias::gradient(const float* dy, float* dBias) {
  double* partials = static_cast<double*>(partials_.get());
  sumChannelSlices<<<grid(), kThreads, 0, backend_.stream()>>>(dy, channels_, plane_, perChannel_, perBlock_, partials, dBias);
  checkLaunch("sumChannelSlices");
  if (slices_ == 1) return;
  finishChannelSums<<<blocksFor(int64_t{channels_} * kWarp), kThreads, 0, backend_.stream()>>>(partials, slices_, channels_, dBias);
  checkLaunch("finishChannelSums");
}

}  // namespace accordion::cuda
