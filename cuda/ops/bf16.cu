// bf16 operands and results of cuDNN and cuBLAS (--precision bf16 on the GPU), and the backend's cast
// cache of the parameters' bf16 copies.
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

void roundInto(CudaBackend& backend, const float* x, void* y, int64_t n) {
  if (n <= 0) return;
  roundKernel<<<blocksFor(n), kThreads, 0, backend.stream()>>>(x, static_cast<uint16_t*>(y), n);
  checkLaunch("bf16 rounding");
}

}  // namespace

std::shared_ptr<void> bf16Storage(CudaBackend& backend, int64_t n) { return backend.allocate(static_cast<size_t>(n) * sizeof(uint16_t)); }

std::shared_ptr<void> bf16Copy(CudaBackend& backend, const float* x, int64_t n) {
  std::shared_ptr<void> copy = bf16Storage(backend, n);
  roundInto(backend, x, copy.get(), n);
  return copy;
}

const void* CudaBackend::bf16Operand(const float* x, int64_t n, std::shared_ptr<void>& fresh) {
  auto* c = casts_.kept(x, n);
  if (!c) {
    fresh = bf16Copy(*this, x, n);
    return fresh.get();
  }
  if (!c->copy) c->copy = bf16Storage(*this, n);
  if (!c->valid) roundInto(*this, x, c->copy.get(), n);
  c->valid = true;
  return c->copy.get();
}

void widenBf16(CudaBackend& backend, const void* x, float* y, int64_t n) {
  if (n <= 0) return;
  widenKernel<<<blocksFor(n), kThreads, 0, backend.stream()>>>(static_cast<const uint16_t*>(x), y, n);
  checkLaunch("widenBf16");
}

}  // namespace accordion::cuda
