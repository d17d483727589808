// Dropout: its mask drawn on the device from a key (ops/dropout_mask.h, the CPU's mask bit for bit),
// then y = keep ? x·scale : 0, scale = 1/(1 − p).
#include "ops/dropout_mask.h"
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

__global__ void __launch_bounds__(kThreads) maskKernel(uint64_t key, float p, uint8_t* keep, int64_t n) {
  const int64_t first = int64_t{blockIdx.x} * blockDim.x + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = first; i < n; i += stride) keep[i] = dropoutKeeps(key, i, p);
}

struct Masked {
  float scale;
  __device__ float operator()(float x, uint8_t keep) const { return keep ? x * scale : 0.0f; }
};

}  // namespace

void CudaBackend::dropoutMask(uint64_t key, float p, uint8_t* keep, int64_t n) {
  if (n <= 0) return;
  maskKernel<<<blocksFor(n), kThreads, 0, stream()>>>(key, p, keep, n);
  checkLaunch("dropoutMask");
}

void CudaBackend::dropoutForward(const float* x, const uint8_t* keep, float* y, int64_t n, float scale) {
  launchElementwise(stream(), "dropoutForward", Masked{scale}, n, y, x, keep);
}

void CudaBackend::dropoutBackward(const float* dy, const uint8_t* keep, float* dx, int64_t n, float scale) {
  launchElementwise(stream(), "dropoutBackward", Masked{scale}, n, dx, dy, keep);
}

}  // namespace accordion::cuda
