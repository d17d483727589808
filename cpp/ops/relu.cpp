// ReLU: y = max(x, 0); dx = dy where the forward output is positive.
#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::reluForward(const float* x, float* y, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

void CpuBackend::reluBackward(const float* y, const float* dy, float* dx, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

}  // namespace accordion
