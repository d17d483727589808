// What both layouts' batch-norm kernels share (batchnorm2d.cu: NCHW, batchnorm2d_nhwc.cu: NHWC):
// the partial sums they merge and how a channel's totals become its outputs.
#pragma once
#include <memory>

#include "ops/batchnorm2d.h"
#include "ops/cuda_backend.h"

namespace accordion::cuda {

// ---- Statistics ------------------------------------------------------------------------------

template <typename T>
struct Moments {
  T count, mean, m2;  // how many values, their mean, Σ (x − mean)²
};

// Chan, Golub and LeVeque's pairwise update.
struct MergeMoments {
  template <typename T>
  __device__ Moments<T> operator()(const Moments<T>& a, const Moments<T>& b) const {
    const T count = a.count + b.count;
    if (count == 0) return a;
    const T delta = b.mean - a.mean, weight = b.count / count;
    return {count, a.mean + delta * weight, a.m2 + b.m2 + delta * delta * a.count * weight};
  }
};

// A channel's batch statistics from the moments of its `count` values less `pivot` (one of them),
// and the running statistics moved toward them (with the unbiased variance, as PyTorch).
__device__ inline void finishStatistics(int64_t channel, const Moments<double>& total, float pivot, int64_t count, float momentum,
                                        float* batchMean, float* batchVar, float* runningMean, float* runningVar) {
  const float mean = static_cast<float>(pivot + total.mean), variance = static_cast<float>(total.m2 / total.count);
  batchMean[channel] = mean;
  batchVar[channel] = variance;
  const float unbias = count > 1 ? static_cast<float>(count) / static_cast<float>(count - 1) : 1.0f;
  runningMean[channel] = (1 - momentum) * runningMean[channel] + momentum * mean;
  runningVar[channel] = (1 - momentum) * runningVar[channel] + momentum * variance * unbias;
}

// ---- Backward --------------------------------------------------------------------------------

template <typename T>
struct GradientSums {
  T dy, dyCentered;  // Σ dy, Σ dy·(x − μ)
};

struct AddSums {
  template <typename T>
  __device__ GradientSums<T> operator()(const GradientSums<T>& a, const GradientSums<T>& b) const {
    return {a.dy + b.dy, a.dyCentered + b.dyCentered};
  }
};

// With batch statistics, dx = (dy − meanDy − (x − μ)·slope)·scale per channel, where
// meanDy = dβ/count, slope = dγ/(σ·count) and scale = γ/σ (σ = √(var + eps)).
struct InputGradientTerms {
  float meanDy, slope, scale;
};

// dγ = Σ dy·x̂ and dβ = Σ dy from a channel's sums over its `count` values and, with batch
// statistics, the channel's InputGradientTerms.
template <bool kFixedStatistics>
__device__ inline void finishGradients(int64_t channel, const GradientSums<double>& total, float invStd, float scale, int64_t count,
                                       float* dGamma, float* dBeta, InputGradientTerms* terms) {
  const double gammaGradient = total.dyCentered * invStd;
  dBeta[channel] = static_cast<float>(total.dy);
  dGamma[channel] = static_cast<float>(gammaGradient);
  if constexpr (!kFixedStatistics) {
    const double n = static_cast<double>(count);
    terms[channel] = {static_cast<float>(total.dy / n), static_cast<float>(gammaGradient * invStd / n), scale};
  }
}

// The batch norm of NHWC activations (batchnorm2d_nhwc.cu).
std::unique_ptr<BatchNorm2dOp> channelsLastBatchNorm2d(CudaBackend& backend, const BatchNormSpec& spec);

}  // namespace accordion::cuda
