// The fused SGD update of every parameter, as torch.optim.SGD (see ops/backend.h).
#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::sgdUpdate(const std::vector<SgdSlot>& slots, const SgdHyper& hyper, bool first) {
  const float lr = hyper.learningRate, m = hyper.momentum, wd = hyper.weightDecay;
  const bool nesterov = hyper.nesterov, useMomentum = hyper.momentum != 0.0f;
  for (const SgdSlot& s : slots) {
    float* p = s.value;
    const float* g = s.grad;
    float* buf = s.momentum;
    const int64_t n = s.size;
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      float d = g[i] + wd * p[i];
      if (useMomentum) {
        buf[i] = first ? d : m * buf[i] + d;
        d = nesterov ? d + m * buf[i] : buf[i];
      }
      p[i] -= lr * d;
    }
  }
}

}  // namespace accordion
