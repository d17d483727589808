// Adaptive average pooling to 1×1 and flattening: (N, C, H, W) channels-last → (N, C).
#include <algorithm>

#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::globalAvgPoolForward(const float* x, float* y, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t hw = h * w;
  const float scale = 1.0f / static_cast<float>(hw);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; ++b) {
    float* out = y + b * c;
    const float* in = x + b * hw * c;
    std::fill(out, out + c, 0.0f);
    for (int64_t p = 0; p < hw; ++p)
      for (int64_t ch = 0; ch < c; ++ch) out[ch] += in[p * c + ch];
    for (int64_t ch = 0; ch < c; ++ch) out[ch] *= scale;
  }
}

void CpuBackend::globalAvgPoolBackward(const float* dy, float* dx, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t hw = h * w;
  const float scale = 1.0f / static_cast<float>(hw);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < n; ++b) {
    const float* g = dy + b * c;
    float* out = dx + b * hw * c;
    for (int64_t p = 0; p < hw; ++p)
      for (int64_t ch = 0; ch < c; ++ch) out[p * c + ch] = g[ch] * scale;
  }
}

}  // namespace accordion
