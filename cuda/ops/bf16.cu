// bf16 operands and results of cuDNN and cuBLAS (--precision bf16 on the GPU).
#include "ops/bf16.cuh"
#include "ops/bf16_rounding.h"
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

__global__ void __launch_bounds__(kThreads) roundKernel(const float* x, uint16_t* y, int64_t n) {
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = first; i < n; i += stride) y[i] = static_cast<uint16_t>(bf16RoundedBits(__float_as_uint(x[i])) >> 16);
}

__global__ void __launch_bounds__(kThreads) widenKernel(const uint16_t* x, float* y, int64_t n) {
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = first; i < n; i += stride) y[i] = __uint_as_float(static_cast<uint32_t>(x[i]) << 16);
}

}  // namespace

std::shared_ptr<void> bf16Storage(CudaBackend& backend, int64_t n) { return backend.allocate(static_cast<size_t>(n) * sizeof(uint16_t)); }

std::shared_ptr<void> bf16Copy(CudaBackend& backend, const float* x, int64_t n) {
  std::shared_ptr<void> copy = bf16Storage(backend, n);
  if (n > 0) {
    roundKernel<<<blocksFor(n), kThreads, 0, backend.stream()>>>(x, static_cast<uint16_t*>(copy.get()), n);
    checkLaunch("bf16Copy");
  }
  return copy;
}

void widenBf16(CudaBackend& backend, const void* x, float* y, int64_t n) {
  if (n <= 0) return;
  widenKernel<<<blocksFor(n), kThreads, 0, backend.stream()>>>(static_cast<const uint16_t*>(x), y, n);
  checkLaunch("widenBf16");
}

}  // namespace accordion::cuda
