#include "optimizer.h"

namespace accordion {

Sgd::Sgd(std::vector<Parameter*> parameters, SgdOptions options) : parameters_(std::move(parameters)), options_(options) {
  for (Parameter* p : parameters_) buffers_.push_back(Tensor::zeros(p->value.shape()));
}

void Sgd::step() {
  const float lr = static_cast<float>(options_.learningRate), m = static_cast<float>(options_.momentum),
              wd = static_cast<float>(options_.weightDecay);
  const bool first = !started_, nesterov = options_.nesterov, useMomentum = options_.momentum != 0.0;
  for (size_t k = 0; k < parameters_.size(); ++k) {
    float* p = parameters_[k]->value.data();
    const float* g = parameters_[k]->grad.data();
    float* buf = buffers_[k].data();
    const int64_t n = parameters_[k]->value.numel();
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
  started_ = true;
}

}  // namespace accordion
