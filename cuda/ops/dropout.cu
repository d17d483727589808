// Dropout with a mask drawn by the caller: y = keep ? x·scale : 0, scale = 1/(1 − p).
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

struct Masked {
  float scale;
  __device__ float operator()(float x, uint8_t keep) const { return keep ? x * scale : 0.0f; }
};

}  // namespace

void CudaBackend::dropoutForward(const float* x, const uint8_t* keep, float* y, int64_t n, float scale) {
  launchElementwise(stream(), "dropoutForward", Masked{scale}, n, y, x, keep);
}

void CudaBackend::dropoutBackward(const float* dy, const uint8_t* keep, float* dx, int64_t n, float scale) {
  launchElementwise(stream(), "dropoutBackward", Masked{scale}, n, dx, dy, keep);
}

}  // namespace accordion::cuda
