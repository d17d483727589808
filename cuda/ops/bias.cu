// A bias over the rows of a row-major matrix (rows, cols): broadcast into every row (before a GEMM
// that accumulates onto it), and summed over the rows (its gradient).
//
// Both work on blocks of 32 adjacent columns (a warp reads 128 contiguous bytes of a row) by
// kRowLanes interleaved rows, over slices of rows, enough blocks in all to fill the GPU. The sums are
// in float per thread, in double across the block's row lanes and across slices, in a fixed order:
// deterministic.
#include <algorithm>

#include "core/check.h"
#include "ops/cuda_backend.h"

namespace accordion::cuda {

namespace {

constexpr int kColumns = 32, kRowLanes = kThreads / kColumns;
// Blocks per launch that keep the largest GPUs busy for a couple of waves.
constexpr int64_t kTargetBlocks = 2048;
// Rows each thread reads before using them, so enough bytes are in flight to saturate memory.
constexpr int kUnroll = 4;

// A grid of column tiles by row slices, each slice of the same length.
struct ColumnGrid {
  dim3 blocks;
  int64_t rowsPerSlice;
};

ColumnGrid columnGrid(int64_t rows, int64_t cols) {
  const int64_t tiles = (cols + kColumns - 1) / kColumns;
  const int64_t byWork = (rows + kRowLanes * kUnroll - 1) / (kRowLanes * kUnroll);
  const int64_t byDevice = (kTargetBlocks + tiles - 1) / tiles;
  const int64_t slices = std::max<int64_t>(1, std::min(byWork, byDevice));
  const int64_t rowsPerSlice = std::max<int64_t>(1, (rows + slices - 1) / slices);
  const int64_t even = std::max<int64_t>(1, (rows + rowsPerSlice - 1) / rowsPerSlice);
  return {dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(even)), rowsPerSlice};
}

// y[r, :] = row for every row of y.
__global__ void broadcastRowsKernel(const float* __restrict__ row, float* __restrict__ y, int64_t rows, int64_t cols,
                                    int64_t rowsPerSlice) {
  const int64_t column = int64_t{blockIdx.x} * kColumns + threadIdx.x;
  if (column >= cols) return;
  const float b = row[column];
  const int64_t end = min(rows, int64_t{blockIdx.y + 1} * rowsPerSlice);
  for (int64_t r = int64_t{blockIdx.y} * rowsPerSlice + threadIdx.y; r < end; r += kRowLanes) y[r * cols + column] = b;
}

// Σ over one slice of rows of each column of x. A single slice is the whole sum, written to sums;
// otherwise partials (slices, cols) hold one sum per slice for finishColumnSums.
__global__ void sumColumnSlices(const float* __restrict__ x, int64_t rows, int64_t cols, int64_t rowsPerSlice,
                                double* __restrict__ partials, float* __restrict__ sums) {
  __shared__ double laneSums[kRowLanes][kColumns];
  const int64_t column = int64_t{blockIdx.x} * kColumns + threadIdx.x;
  const int64_t end = min(rows, int64_t{blockIdx.y + 1} * rowsPerSlice);
  float sum = 0;
  if (column < cols) {
    int64_t r = int64_t{blockIdx.y} * rowsPerSlice + threadIdx.y;
    for (; r + (kUnroll - 1) * kRowLanes < end; r += kUnroll * kRowLanes) {
      float value[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) value[u] = x[(r + u * kRowLanes) * cols + column];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sum += value[u];
    }
    for (; r < end; r += kRowLanes) sum += x[r * cols + column];
  }
  laneSums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || column >= cols) return;
  double total = 0;
  for (int lane = 0; lane < kRowLanes; ++lane) total += laneSums[lane][threadIdx.x];
  if (gridDim.y == 1)
    sums[column] = static_cast<float>(total);
  else
    partials[int64_t{blockIdx.y} * cols + column] = total;
}

// sums[j] = Σ_s partials[s, j] in double; adjacent threads read adjacent columns.
__global__ void finishColumnSums(const double* __restrict__ partials, int slices, int64_t cols, float* __restrict__ sums) {
  for (int64_t column = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; column < cols; column += int64_t{gridDim.x} * blockDim.x) {
    double total = 0;
    for (int s = 0; s < slices; ++s) total += partials[s * cols + column];
    sums[column] = static_cast<float>(total);
  }
}

}  // namespace

void CudaBackend::broadcastRows(const float* row, float* y, int64_t rows, int64_t cols) {
  if (rows <= 0 || cols <= 0) return;
  const ColumnGrid grid = columnGrid(rows, cols);
  broadcastRowsKernel<<<grid.blocks, dim3(kColumns, kRowLanes), 0, stream()>>>(row, y, rows, cols, grid.rowsPerSlice);
  checkLaunch("broadcastRows");
}

void CudaBackend::columnSums(const float* x, float* sums, int64_t rows, int64_t cols) {
  if (cols <= 0) return;
  if (rows <= 0) {
    fill(sums, cols, 0.0f);
    return;
  }
  const ColumnGrid grid = columnGrid(rows, cols);
  const int slices = static_cast<int>(grid.blocks.y);
  // The partial sums live in scratch memory for this call.
  const std::shared_ptr<void> scratchMemory = scratch(slices > 1 ? static_cast<size_t>(slices) * cols * sizeof(double) : 0);
  double* partials = static_cast<double*>(scratchMemory.get());
  sumColumnSlices<<<grid.blocks, dim3(kColumns, kRowLanes), 0, stream()>>>(x, rows, cols, grid.rowsPerSlice, partials, sums);
  checkLaunch("sumColumnSlices");
  if (slices == 1) return;
  finishColumnSums<<<blocksFor(cols), kThreads, 0, stream()>>>(partials, slices, cols, sums);
  checkLaunch("finishColumnSums");
}

}  // namespace accordion::cuda
