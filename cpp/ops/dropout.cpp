// Dropout: its mask drawn from a key (ops/dropout_mask.h), then y = keep ? x·scale : 0,
// scale = 1/(1 − p).
#include "ops/cpu_backend.h"
#include "ops/dropout_mask.h"

namespace accordion {

void CpuBackend::dropoutMask(uint64_t key, float p, uint8_t* keep, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) keep[i] = dropoutKeeps(key, i, p);
}

void CpuBackend::dropoutForward(const float* x, const uint8_t* keep, float* y, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) y[i] = keep[i] ? x[i] * scale : 0.0f;
}

void CpuBackend::dropoutBackward(const float* dy, const uint8_t* keep, float* dx, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) dx[i] = keep[i] ? dy[i] * scale : 0.0f;
}

}  // namespace accordion
