// Linear on cuBLAS (fp32 GEMMs, no TF32): y = x·Wᵀ + b, dW = dyᵀ·x, dx = dy·W, db = Σ_rows dy, with
// x (rows, in), W (out, in), y and dy (rows, out), all row-major.
//
// cuBLAS is column-major, and a row-major (r, c) buffer with leading dimension c is, to cuBLAS, its
// transpose: a column-major (c, r) matrix with the same leading dimension. So each row-major product
// C = A·B is asked as Cᵀ = Bᵀ·Aᵀ, whose column-major result is C's row-major buffer; an operand is
// op N where the product needs its transpose (what cuBLAS sees) and op T where it needs the matrix:
//   y  = x·Wᵀ  as yᵀ (out, rows) = W·xᵀ:   sgemm(T, N, out, rows, in,  W ld in, x ld in,   y ld out)
//   dW = dyᵀ·x as dWᵀ (in, out)  = xᵀ·dy:  sgemm(N, T, in, out, rows,  x ld in, dy ld out, dW ld in)
//   dx = dy·W  as dxᵀ (in, rows) = Wᵀ·dyᵀ: sgemm(N, N, in, rows, out,  W ld in, dy ld out, dx ld in)
#include <algorithm>
#include <climits>
#include <string>

#include "core/check.h"
#include "ops/cuda_backend.h"

namespace accordion::cuda {

namespace {

// The bias kernels' blocks: 32 adjacent columns (a warp reads 128 contiguous bytes of a row) by
// kRowLanes interleaved rows.
constexpr int kColumns = 32, kRowLanes = kThreads / kColumns;
// Blocks per launch that keep the largest GPUs busy for a couple of waves.
constexpr int64_t kTargetBlocks = 2048;
// Rows each thread reads before using them, so enough bytes are in flight to saturate memory.
constexpr int kUnroll = 4;

// cuBLAS takes int dimensions.
int blasDimension(int64_t size, const char* name) {
  if (size > INT_MAX) throw invalidArgument("linear " + std::string(name) + " " + std::to_string(size) + " exceeds cuBLAS's int range");
  return static_cast<int>(size);
}

// A grid of column tiles by row slices, each slice of the same length, enough in all to fill the GPU.
struct ColumnGrid {
  dim3 blocks;
  int64_t rowsPerSlice;
};

ColumnGrid columnGrid(int64_t rows, int64_t out) {
  const int64_t tiles = (out + kColumns - 1) / kColumns;
  const int64_t byWork = (rows + kRowLanes * kUnroll - 1) / (kRowLanes * kUnroll);
  const int64_t byDevice = (kTargetBlocks + tiles - 1) / tiles;
  const int64_t slices = std::max<int64_t>(1, std::min(byWork, byDevice));
  const int64_t rowsPerSlice = std::max<int64_t>(1, (rows + slices - 1) / slices);
  const int64_t even = std::max<int64_t>(1, (rows + rowsPerSlice - 1) / rowsPerSlice);
  return {dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(even)), rowsPerSlice};
}

// y[r, :] = bias for every row of y (rows, out); the forward's GEMM then adds x·Wᵀ (β = 1).
__global__ void broadcastRows(const float* __restrict__ bias, float* __restrict__ y, int64_t rows, int64_t out,
                              int64_t rowsPerSlice) {
  const int64_t column = int64_t{blockIdx.x} * kColumns + threadIdx.x;
  if (column >= out) return;
  const float b = bias[column];
  const int64_t end = min(rows, int64_t{blockIdx.y + 1} * rowsPerSlice);
  for (int64_t r = int64_t{blockIdx.y} * rowsPerSlice + threadIdx.y; r < end; r += kRowLanes) y[r * out + column] = b;
}

// Σ over one slice of rows of each column of dy (rows, out): in float per thread, in double across
// the block's row lanes, in a fixed order. A single slice is the whole sum, written to dBias;
// otherwise partials (slices, out) hold one sum per slice for finishColumnSums.
__global__ void sumColumnSlices(const float* __restrict__ dy, int64_t rows, int64_t out, int64_t rowsPerSlice,
                                double* __restrict__ partials, float* __restrict__ dBias) {
  __shared__ double laneSums[kRowLanes][kColumns];
  const int64_t column = int64_t{blockIdx.x} * kColumns + threadIdx.x;
  const int64_t end = min(rows, int64_t{blockIdx.y + 1} * rowsPerSlice);
  float sum = 0;
  if (column < out) {
    int64_t r = int64_t{blockIdx.y} * rowsPerSlice + threadIdx.y;
    for (; r + (kUnroll - 1) * kRowLanes < end; r += kUnroll * kRowLanes) {
      float value[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) value[u] = dy[(r + u * kRowLanes) * out + column];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) sum += value[u];
    }
    for (; r < end; r += kRowLanes) sum += dy[r * out + column];
  }
  laneSums[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y != 0 || column >= out) return;
  double total = 0;
  for (int lane = 0; lane < kRowLanes; ++lane) total += laneSums[lane][threadIdx.x];
  if (gridDim.y == 1)
    dBias[column] = static_cast<float>(total);
  else
    partials[int64_t{blockIdx.y} * out + column] = total;
}

// dBias[j] = Σ_s partials[s, j] in double; adjacent threads read adjacent columns.
__global__ void finishColumnSums(const double* __restrict__ partials, int slices, int64_t out, float* __restrict__ dBias) {
  for (int64_t column = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; column < out; column += int64_t{gridDim.x} * blockDim.x) {
    double total = 0;
    for (int s = 0; s < slices; ++s) total += partials[s * out + column];
    dBias[column] = static_cast<float>(total);
  }
}

}  // namespace

void CudaBackend::linearForward(const float* x, const float* weight, const float* bias, float* y, int64_t rows, int64_t in,
                                int64_t out) {
  const int m = blasDimension(out, "outputs"), n = blasDimension(rows, "rows"), k = blasDimension(in, "inputs");
  const ColumnGrid grid = columnGrid(rows, out);
  broadcastRows<<<grid.blocks, dim3(kColumns, kRowLanes), 0, stream()>>>(bias, y, rows, out, grid.rowsPerSlice);
  checkLaunch("broadcastRows");
  const float one = 1;
  // yᵀ (out, rows) = W·xᵀ + yᵀ
  cublas::check(cublas::api().sgemm(cublas(), cublas::kTranspose, cublas::kNoTranspose, m, n, k, &one, weight, k, x, k, &one, y, m),
                "cublasSgemm (linear forward)");
}

void CudaBackend::linearBackward(const float* x, const float* weight, const float* dy, float* dx, float* dWeight, float* dBias,
                                 int64_t rows, int64_t in, int64_t out) {
  const int r = blasDimension(rows, "rows"), i = blasDimension(in, "inputs"), o = blasDimension(out, "outputs");
  const cublas::Api& blas = cublas::api();
  const float one = 1, zero = 0;
  // dWᵀ (in, out) = xᵀ·dy
  cublas::check(blas.sgemm(cublas(), cublas::kNoTranspose, cublas::kTranspose, i, o, r, &one, x, i, dy, o, &zero, dWeight, i),
                "cublasSgemm (linear weight gradient)");
  // dxᵀ (in, rows) = Wᵀ·dyᵀ
  cublas::check(blas.sgemm(cublas(), cublas::kNoTranspose, cublas::kNoTranspose, i, r, o, &one, weight, i, dy, o, &zero, dx, i),
                "cublasSgemm (linear input gradient)");

  const ColumnGrid grid = columnGrid(rows, out);
  const int slices = static_cast<int>(grid.blocks.y);
  // The partial sums live in the shared scratch: every op runs in order on the one stream, so it is
  // free between convolutions.
  double* partials = slices > 1 ? static_cast<double*>(workspace(static_cast<size_t>(slices) * out * sizeof(double))) : nullptr;
  sumColumnSlices<<<grid.blocks, dim3(kColumns, kRowLanes), 0, stream()>>>(dy, rows, out, grid.rowsPerSlice, partials, dBias);
  checkLaunch("sumColumnSlices");
  if (slices == 1) return;
  finishColumnSums<<<blocksFor(out), kThreads, 0, stream()>>>(partials, slices, out, dBias);
  checkLaunch("finishColumnSums");
}

}  // namespace accordion::cuda
