// The dense exchange on the GPU: every uncompressed tensor copied into, and back out of, the one
// buffer of the step's all-reduce, each direction one multi-tensor launch.
#include "ops/cuda_compression_kernels.h"
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

struct PackEntry {
  float* tensor;
  float* buffer;  // the tensor's place in the exchange buffer
  int64_t size;
  int64_t packed;
};

template <bool kIntoBuffer>
__global__ void __launch_bounds__(kThreads) copyKernel(const PackEntry* tensors, const TensorChunk* chunks, float scale) {
  const TensorChunk chunk = chunks[blockIdx.x];
  const PackEntry t = tensors[chunk.tensor];
  forEachInChunk(
      t.size, chunk.chunk, t.packed,
      [&](int64_t p) {
        if constexpr (kIntoBuffer) {
          storePack<4>(t.buffer, p, loadPack<4>(static_cast<const float*>(t.tensor), p));
        } else {
          Pack<float, 4> v = loadPack<4>(static_cast<const float*>(t.buffer), p);
#pragma unroll
          for (int l = 0; l < 4; ++l) v.v[l] *= scale;
          storePack<4>(t.tensor, p, v);
        }
      },
      [&](int64_t i) {
        if constexpr (kIntoBuffer)
          t.buffer[i] = t.tensor[i];
        else
          t.tensor[i] = t.buffer[i] * scale;
      });
}

std::vector<PackEntry> entries(const std::vector<Span>& tensors, const float* buffer) {
  std::vector<PackEntry> table;
  float* place = const_cast<float*>(buffer);
  for (const Span& t : tensors) {
    table.push_back({t.data, place, t.size, packable(t.data) && packable(place)});
    place += t.size;
  }
  return table;
}

}  // namespace

void CudaCompressionKernels::pack(const std::vector<Span>& tensors, float* buffer) {
  launchMultiTensor(backend_, "dense pack", copyKernel<true>, entries(tensors, buffer), 1.0f);
}

void CudaCompressionKernels::unpack(const float* buffer, const std::vector<Span>& tensors, float scale) {
  launchMultiTensor(backend_, "dense unpack", copyKernel<false>, entries(tensors, buffer), scale);
}

}  // namespace accordion::cuda
