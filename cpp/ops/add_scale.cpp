// The residual add (a += b), its backward's fan-in (out = a + b), and scaling (y = s·x).
#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::addInPlace(float* a, const float* b, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) a[i] += b[i];
}

void CpuBackend::add(const float* a, const float* b, float* out, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void CpuBackend::scale(const float* x, float* y, int64_t n, float s) {
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
}

}  // namespace accordion
