// Batched transposition through shared memory (transpose.cuh): a block moves 32×32 tiles, reading
// rows of the source and writing rows of the destination, so both sides are whole 128-byte lines
// (the tile has a column of padding, so its column reads hit 32 banks).
#include <algorithm>

#include "ops/bf16_rounding.h"
#include "ops/kernels.cuh"
#include "ops/transpose.cuh"

namespace accordion::cuda {

namespace {

constexpr int kTile = 32, kTileRows = 8;  // a block: 32 × 8 threads, each moving 4 elements of a tile
constexpr int64_t kMaxGrid = 65535;       // the grid's y and z dimensions

__device__ __forceinline__ float widened(float v) { return v; }
__device__ __forceinline__ float widened(uint16_t v) { return __uint_as_float(static_cast<uint32_t>(v) << 16); }
template <typename Out>
__device__ __forceinline__ Out narrowed(float v) {
  if constexpr (std::is_same_v<Out, float>)
    return v;
  else
    return static_cast<uint16_t>(bf16RoundedBits(__float_as_uint(v)) >> 16);
}

template <typename In, typename Out>
__global__ void __launch_bounds__(kTile* kTileRows) transposeKernel(const In* __restrict__ src, Out* __restrict__ dst, int64_t batch,
                                                                    int rows, int cols) {
  __shared__ float tile[kTile][kTile + 1];
  const int64_t matrix = int64_t{rows} * cols;
  // Every loop bound below depends on the block alone, so the whole block reaches each barrier.
  for (int64_t b = blockIdx.z; b < batch; b += gridDim.z) {
    const In* s = src + b * matrix;
    Out* d = dst + b * matrix;
    for (int rowTile = blockIdx.y * kTile; rowTile < rows; rowTile += gridDim.y * kTile)
      for (int colTile = blockIdx.x * kTile; colTile < cols; colTile += gridDim.x * kTile) {
        const int col = colTile + threadIdx.x;
#pragma unroll
        for (int r = threadIdx.y; r < kTile; r += kTileRows) {
          const int row = rowTile + r;
          if (row < rows && col < cols) tile[r][threadIdx.x] = widened(s[int64_t{row} * cols + col]);
        }
        __syncthreads();
        const int row = rowTile + threadIdx.x;  // the destination's column
#pragma unroll
        for (int c = threadIdx.y; c < kTile; c += kTileRows) {
          const int destinationRow = colTile + c;
          if (row < rows && destinationRow < cols) d[int64_t{destinationRow} * rows + row] = narrowed<Out>(tile[threadIdx.x][c]);
        }
        __syncthreads();  // the tile is refilled next
      }
  }
}

template <typename In, typename Out>
void launch(CudaBackend& backend, const void* src, void* dst, int64_t batch, int rows, int cols) {
  const dim3 grid(static_cast<unsigned>((cols + kTile - 1) / kTile), static_cast<unsigned>(std::min<int64_t>((rows + kTile - 1) / kTile, kMaxGrid)),
                  static_cast<unsigned>(std::min(batch, kMaxGrid)));
  transposeKernel<In, Out><<<grid, dim3(kTile, kTileRows), 0, backend.stream()>>>(static_cast<const In*>(src), static_cast<Out*>(dst),
                                                                                   batch, rows, cols);
  checkLaunch("transposeBatched");
}

}  // namespace

void transposeBatched(CudaBackend& backend, const void* src, Element in, void* dst, Element out, int64_t batch, int64_t rows,
                      int64_t cols) {
  if (batch <= 0 || rows <= 0 || cols <= 0) return;
  if (rows * cols > INT32_MAX) throw invalidArgument("a transposition of matrices of 2^31 or more elements");
  const int r = static_cast<int>(rows), c = static_cast<int>(cols);
  if (in == Element::Fp32 && out == Element::Fp32)
    launch<float, float>(backend, src, dst, batch, r, c);
  else if (in == Element::Fp32)
    launch<float, uint16_t>(backend, src, dst, batch, r, c);
  else if (out == Element::Fp32)
    launch<uint16_t, float>(backend, src, dst, batch, r, c);
  else
    launch<uint16_t, uint16_t>(backend, src, dst, batch, r, c);
}

}  // namespace accordion::cuda
