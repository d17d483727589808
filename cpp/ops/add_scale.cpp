// Addition (out = a + b: the residual add, as add(a, b, a), and its backward's fan-in) and scaling (y = s·x).
#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::add(const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void CpuBackend::scale(const float* x, float* y, int64_t n, float s) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
}

}  // namespace accordion
