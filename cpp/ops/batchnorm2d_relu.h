// A batch norm with its ReLU fused (BatchNormSpec::relu) made of one without it and the backend's
// ReLU ops, for a backend whose batch norm kernels do not apply the ReLU themselves: the same
// results as the two modules, at their cost.
#pragma once
#include <memory>

#include "ops/backend.h"
#include "ops/batchnorm2d.h"

namespace accordion {

class ReluAfterBatchNorm : public BatchNorm2dOp {
 public:
  // `plain`: the batch norm of `spec` without the ReLU.
  ReluAfterBatchNorm(Backend& ops, const BatchNormSpec& spec, std::unique_ptr<BatchNorm2dOp> plain)
      : ops_(ops), shape_(spec.shape()), plain_(std::move(plain)) {}

  void forwardTraining(const float* x, const float* gamma, const float* beta, float* y, float* batchMean, float* batchVar,
                       float* runningMean, float* runningVar) override {
    plain_->forwardTraining(x, gamma, beta, y, batchMean, batchVar, runningMean, runningVar);
    relu(y);
  }
  void forwardInference(const float* x, const float* gamma, const float* beta, const float* mean, const float* var,
                        float* y) override {
    plain_->forwardInference(x, gamma, beta, mean, var, y);
    relu(y);
  }
  // The forward's output (kept by the caller until backward) masks dy, as a ReLU module's backward.
  void backward(const float* x, const float* dy, const float* gamma, const float* beta, const float* mean, const float* var,
                bool batchStatistics, float* dx, float* dGamma, float* dBeta) override {
    Tensor masked(shape_, ops_);
    ops_.reluBackward(output_, dy, masked.data(), masked.numel());
    plain_->backward(x, masked.data(), gamma, beta, mean, var, batchStatistics, dx, dGamma, dBeta);
  }

 private:
  void relu(float* y) {
    ops_.reluForward(y, y, numelOf(shape_));
    output_ = y;
  }

  Backend& ops_;
  Shape shape_;
  std::unique_ptr<BatchNorm2dOp> plain_;
  const float* output_ = nullptr;
};

}  // namespace accordion
