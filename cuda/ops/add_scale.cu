// Addition (out = a + b: the residual add, as add(a, b, a), and its backward's fan-in) and scaling (y = s·x).
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

struct Sum {
  __device__ float operator()(float a, float b) const { return a + b; }
};

struct Scaled {
  float factor;
  __device__ float operator()(float x) const { return x * factor; }
};

}  // namespace

void CudaBackend::add(const float* a, const float* b, float* out, int64_t n) { launchElementwise(stream(), "add", Sum{}, n, out, a, b); }

void CudaBackend::scale(const float* x, float* y, int64_t n, float s) { launchElementwise(stream(), "scale", Scaled{s}, n, y, x); }

}  // namespace accordion::cuda
