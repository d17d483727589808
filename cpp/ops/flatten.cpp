// (N, C, H, W) channels-last → (N, C·H·W) in PyTorch's channel-major order, and back.
#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::flattenForward(const float* x, float* y, int64_t n, int64_t c, int64_t h, int64_t w) { nhwcToNchw(x, y, n, c, h, w); }

void CpuBackend::flattenBackward(const float* dy, float* dx, int64_t n, int64_t c, int64_t h, int64_t w) {
  nchwToNhwc(dy, dx, n, c, h, w);
}

}  // namespace accordion
