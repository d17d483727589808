// Batch normalisation over (N, H, W) per channel, as torch.nn.BatchNorm2d: the running variance is
// updated with the unbiased batch variance, normalisation uses the biased one.
#pragma once
#include "core/tensor.h"

namespace accordion {

struct BatchNormSpec {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  float eps = 1e-5f, momentum = 0.1f;
  // The ReLU after it, fused: y = max(0, batch norm(x)) in every forward, and backward takes the
  // gradient of that output (zero where it is zero), as a ReLU module after it would.
  bool relu = false;
  Shape shape() const { return {batch, channels, height, width}; }
};

class BatchNorm2dOp {
 public:
  virtual ~BatchNorm2dOp() = default;
  // Training: y = γ·(x − μ_B)/√(σ²_B + eps) + β with the batch statistics, which are stored in
  // batchMean and batchVar (biased); the running statistics move toward them by `momentum`.
  virtual void forwardTraining(const float* x, const float* gamma, const float* beta, float* y, float* batchMean, float* batchVar,
                               float* runningMean, float* runningVar) = 0;
  // Evaluation and frozen batch norm: normalises with fixed statistics.
  virtual void forwardInference(const float* x, const float* gamma, const float* beta, const float* mean, const float* var,
                                float* y) = 0;
  // dx, dγ, dβ from dy. `batchStatistics`: mean and var are the forward's batch statistics, so the
  // gradient flows through them; otherwise they are constants.
  virtual void backward(const float* x, const float* dy, const float* gamma, const float* beta, const float* mean, const float* var,
                        bool batchStatistics, float* dx, float* dGamma, float* dBeta) = 0;
};

}  // namespace accordion
