// Device helpers shared by the CUDA ops of this folder: 16-byte packed access, the element-wise and
// multi-tensor launch schemes, and deterministic warp and block reductions.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "core/check.h"
#include "ops/cuda_backend.h"

namespace accordion::cuda {

// ---- Packed access ---------------------------------------------------------------------------
// kWidth consecutive elements moved as one access: 4 floats are one 16-byte load, 4 bytes one
// 4-byte load. Pack index p covers elements [kWidth·p, kWidth·p + kWidth).
template <typename T, int kWidth>
struct Pack {
  T v[kWidth];
};

// The CUDA vector type of four T.
template <typename T>
struct Vector4;
template <>
struct Vector4<float> {
  using type = float4;
};
template <>
struct Vector4<uint8_t> {
  using type = uchar4;
};

template <typename V>
__device__ __forceinline__ auto unpack(const V& v) {
  return Pack<decltype(v.x), 4>{{v.x, v.y, v.z, v.w}};
}

template <int kWidth, typename T>
__device__ __forceinline__ Pack<T, kWidth> loadPack(const T* data, int64_t index) {
  static_assert(kWidth == 4 || kWidth == 1, "packs are 4 elements or single ones");
  if constexpr (kWidth == 4)
    return unpack(reinterpret_cast<const typename Vector4<T>::type*>(data)[index]);
  else
    return {{data[index]}};
}

template <int kWidth>
__device__ __forceinline__ void storePack(float* data, int64_t index, const Pack<float, kWidth>& pack) {
  static_assert(kWidth == 4 || kWidth == 1, "packs are 4 elements or single ones");
  if constexpr (kWidth == 4)
    reinterpret_cast<float4*>(data)[index] = make_float4(pack.v[0], pack.v[1], pack.v[2], pack.v[3]);
  else
    data[index] = pack.v[0];
}

// Whether `data` can be read in packs of 4 elements.
template <typename T>
bool packable(const T* data) {
  return reinterpret_cast<uintptr_t>(data) % (4 * sizeof(T)) == 0;
}

// ---- Element-wise kernels ----------------------------------------------------------------------
// out[i] = f(in[i]...) for i < n, grid-stride: in packs of kWidth, then the last n % kWidth
// elements one by one. `out` may be one of the inputs (each element is read before it is written,
// by the same thread).
template <int kWidth, typename F, typename... In>
__global__ void __launch_bounds__(kThreads) elementwiseKernel(F f, int64_t n, float* out, const In*... in) {
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t packs = n / kWidth;
  for (int64_t p = first; p < packs; p += stride) {
    const auto apply = [&](const Pack<In, kWidth>&... args) {
      Pack<float, kWidth> result;
#pragma unroll
      for (int l = 0; l < kWidth; ++l) result.v[l] = f(args.v[l]...);
      return result;
    };
    storePack<kWidth>(out, p, apply(loadPack<kWidth>(in, p)...));
  }
  for (int64_t i = packs * kWidth + first; i < n; i += stride) out[i] = f(in[i]...);
}

// Launches elementwiseKernel on `stream`, in 16-byte packs when every pointer allows them.
template <typename F, typename... In>
void launchElementwise(cudaStream_t stream, const char* name, F f, int64_t n, float* out, const In*... in) {
  if (n <= 0) return;
  if (packable(out) && (packable(in) && ...))
    elementwiseKernel<4><<<blocksFor((n + 3) / 4), kThreads, 0, stream>>>(f, n, out, in...);
  else
    elementwiseKernel<1><<<blocksFor(n), kThreads, 0, stream>>>(f, n, out, in...);
  checkLaunch(name);
}

// ---- Multi-tensor kernels ----------------------------------------------------------------------
// One launch over a list of tensors: block b works on chunk chunks[b].chunk (kChunkElements
// elements) of tensor chunks[b].tensor. The tensor table (an Entry per tensor, with at least `size`
// and `packed`) and the chunk map go to the device through deviceTable(), so a list that repeats
// every step uploads once. Entries must have no padding: the table is cached by its bytes.
struct TensorChunk {
  int32_t tensor, chunk;
};

constexpr int64_t kChunkElements = 16 * kThreads;  // four 16-byte packs per thread

template <typename Entry>
std::vector<TensorChunk> chunksOf(const std::vector<Entry>& tensors) {
  std::vector<TensorChunk> chunks;
  for (size_t t = 0; t < tensors.size(); ++t)
    for (int64_t c = 0; c * kChunkElements < tensors[t].size; ++c) chunks.push_back({static_cast<int32_t>(t), static_cast<int32_t>(c)});
  return chunks;
}

// Launches kernel<<<one block per chunk>>>(table, chunkMap, args...) on the backend's stream and
// returns the device table (nullptr, and no launch, when the tensors hold no element).
template <typename Entry, typename... Params, typename... Args>
const Entry* launchMultiTensor(CudaBackend& backend, const char* name, void (*kernel)(const Entry*, const TensorChunk*, Params...),
                               const std::vector<Entry>& tensors, Args... args) {
  static_assert(std::has_unique_object_representations_v<Entry>, "table entries must have no padding");
  const std::vector<TensorChunk> chunks = chunksOf(tensors);
  if (chunks.empty()) return nullptr;
  const auto* table = static_cast<const Entry*>(backend.deviceTable(tensors.data(), tensors.size() * sizeof(Entry)));
  const auto* map = static_cast<const TensorChunk*>(backend.deviceTable(chunks.data(), chunks.size() * sizeof(TensorChunk)));
  kernel<<<static_cast<unsigned>(chunks.size()), kThreads, 0, backend.stream()>>>(table, map, args...);
  checkLaunch(name);
  return table;
}

// Calls onPack(p) for each pack of 4 of a block's chunk when `packed`, onElement(i) for the rest,
// spread over the block's threads.
template <typename OnPack, typename OnElement>
__device__ __forceinline__ void forEachInChunk(int64_t size, int32_t chunk, bool packed, OnPack onPack, OnElement onElement) {
  const int64_t begin = int64_t{chunk} * kChunkElements;
  const int64_t end = size < begin + kChunkElements ? size : begin + kChunkElements;
  const int64_t packedEnd = packed ? begin + (end - begin) / 4 * 4 : begin;
  for (int64_t p = begin / 4 + threadIdx.x; p < packedEnd / 4; p += blockDim.x) onPack(p);
  for (int64_t i = packedEnd + threadIdx.x; i < end; i += blockDim.x) onElement(i);
}

// ---- Reductions --------------------------------------------------------------------------------
// Any trivially copyable value of whole 32-bit words, from lane (this lane ^ laneMask).
template <typename T>
__device__ __forceinline__ T shuffleXor(const T& value, int laneMask) {
  static_assert(sizeof(T) % sizeof(int) == 0, "shuffled values are whole 32-bit words");
  constexpr int kWords = sizeof(T) / sizeof(int);
  int words[kWords];
  memcpy(words, &value, sizeof(T));
#pragma unroll
  for (int w = 0; w < kWords; ++w) words[w] = __shfl_xor_sync(0xffffffffu, words[w], laneMask);
  T result;
  memcpy(&result, words, sizeof(T));
  return result;
}

// Combines the 32 lanes' values in a butterfly; every lane must call it. The tree is fixed, so the
// result is deterministic; with a commutative `combine` every lane holds the same bits.
template <typename T, typename Combine>
__device__ __forceinline__ T warpAllReduce(T value, Combine combine) {
#pragma unroll
  for (int mask = 16; mask > 0; mask /= 2) value = combine(value, shuffleXor(value, mask));
  return value;
}

// Combines one value per thread (blockDim.x a multiple of 32); thread 0 gets the result. Every
// thread must call it; `identity` fills the lanes beyond the block's warps.
template <typename T, typename Combine>
__device__ T blockReduce(T value, Combine combine, T identity) {
  __shared__ T warpResults[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  value = warpAllReduce(value, combine);
  if (lane == 0) warpResults[warp] = value;
  __syncthreads();
  if (warp == 0) value = warpAllReduce(lane < static_cast<int>(blockDim.x / 32) ? warpResults[lane] : identity, combine);
  __syncthreads();  // warpResults is free for the next call
  return value;
}

// blockReduce with the result in every thread.
template <typename T, typename Combine>
__device__ T blockAllReduce(T value, Combine combine, T identity) {
  __shared__ T result;
  value = blockReduce(value, combine, identity);
  if (threadIdx.x == 0) result = value;
  __syncthreads();
  // A next call writes `result` only after its own barriers, which every thread reaches after this read.
  return result;
}

// A value that other blocks of this launch wrote (after a __threadfence), read from L2 so that no
// stale L1 line can answer. T is made of 8-byte words.
template <typename T>
__device__ __forceinline__ T loadFromL2(const T* data) {
  static_assert(sizeof(T) % sizeof(double) == 0 && alignof(T) >= alignof(double), "read as whole 8-byte words");
  constexpr int kWords = sizeof(T) / sizeof(double);
  double words[kWords];
#pragma unroll
  for (int w = 0; w < kWords; ++w) words[w] = __ldcg(reinterpret_cast<const double*>(data) + w);
  T result;
  memcpy(&result, words, sizeof(T));
  return result;
}

// How many blocks of kThreads threads of `kernel` run at once on device `device`.
template <typename Kernel>
int residentBlocks(Kernel kernel, int device) {
  int multiprocessors = 0, perMultiprocessor = 0;
  check(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device), "cudaDeviceGetAttribute");
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&perMultiprocessor, kernel, kThreads, 0),
        "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
  return multiprocessors * (perMultiprocessor > 0 ? perMultiprocessor : 1);
}

}  // namespace accordion::cuda
