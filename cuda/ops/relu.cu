// ReLU: y = max(x, 0); dx = dy where the forward output is positive. NaN inputs give 0, as on the CPU.
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

struct Relu {
  __device__ float operator()(float x) const { return x > 0.0f ? x : 0.0f; }
};

struct ReluGradient {
  __device__ float operator()(float y, float dy) const { return y > 0.0f ? dy : 0.0f; }
};

}  // namespace

void CudaBackend::reluForward(const float* x, float* y, int64_t n) { launchElementwise(stream(), "reluForward", Relu{}, n, y, x); }

void CudaBackend::reluBackward(const float* y, const float* dy, float* dx, int64_t n) {
  launchElementwise(stream(), "reluBackward", ReluGradient{}, n, dx, y, dy);
}

}  // namespace accordion::cuda
