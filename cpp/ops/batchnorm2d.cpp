// BatchNorm2d on the CPU, channels-last: x is P = N·H·W positions of C contiguous channels.
//
// Every per-channel sum (the batch mean and variance; backward's Σdy and Σdy·(x − μ)) accumulates in
// double over fixed blocks of positions, and the blocks are added in order: the statistics are
// accurate to float precision for any batch size and bitwise the same for any thread count. (Float
// accumulation over the 32 768 positions of a CIFAR batch of 32 loses up to four decimal digits,
// which moves the normalised values by 1e-5 and tips ReLUs whose input is that close to zero.)
//
// With a fused ReLU (BatchNormSpec::relu) backward recomputes the normalised value from x rather than
// reading the output: the same fused multiply-add as the forward's, so the same value bit for bit,
// and two passes over the activations fewer than a ReLU module's.
#include "ops/batchnorm2d.h"
#include "ops/batchnorm2d_relu.h"

#include <cmath>
#include <vector>

#include "ops/cpu_backend.h"

namespace accordion {

namespace {

constexpr int64_t kBlock = 256;  // positions per partial sum
constexpr int64_t kMaxFusedChannels = 1024;  // channels of a batch norm with a fused ReLU (a row on the stack)

// Per channel c: first[c] = Σ_p f(p, c) and second[c] = Σ_p g(p, c) in double, where
// `terms(p, f, g)` adds position p's terms of every channel to f[c] and g[c]. Blocks of kBlock
// positions are summed in parallel, then added in block order.
template <typename Terms>
void channelSums(int64_t positions, int64_t channels, Terms terms, std::vector<double>& first, std::vector<double>& second) {
  const int64_t blocks = (positions + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(2 * blocks * channels), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t b = 0; b < blocks; ++b) {
    double* f = partial.data() + 2 * b * channels;
    double* g = f + channels;
    const int64_t end = std::min(positions, (b + 1) * kBlock);
    for (int64_t p = b * kBlock; p < end; ++p) terms(p, f, g);
  }
  first.assign(static_cast<size_t>(channels), 0.0);
  second.assign(static_cast<size_t>(channels), 0.0);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t c = 0; c < channels; ++c) {
      first[c] += partial[2 * b * channels + c];
      second[c] += partial[(2 * b + 1) * channels + c];
    }
}

// y = (x − μ)·γσ⁻¹ + β, in one rounding, as forward and the ReLU's mask in backward compute it.
inline float normalized(float x, float mean, float scale, float beta) { return std::fma(x - mean, scale, beta); }

class CpuBatchNorm2d : public BatchNorm2dOp {
 public:
  explicit CpuBatchNorm2d(const BatchNormSpec& spec)
      : spec_(spec), positions_(spec.batch * spec.height * spec.width), channels_(spec.channels) {}

  void forwardTraining(const float* x, const float* gamma, const float* beta, float* y, float* batchMean, float* batchVar,
                       float* runningMean, float* runningVar) override {
    const int64_t C = channels_, P = positions_;
    // Shifted sums Σ(x − s) and Σ(x − s)² with s the first position's value: exact enough in double
    // however far the mean lies from zero.
    const float* shift = x;
    std::vector<double> sum, squares;
    channelSums(
        P, C,
        [&](int64_t p, double* f, double* g) {
          const float* row = x + p * C;
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            const double d = static_cast<double>(row[c]) - static_cast<double>(shift[c]);
            f[c] += d;
            g[c] += d * d;
          }
        },
        sum, squares);
    const double count = static_cast<double>(P);
    const double unbias = P > 1 ? count / (count - 1) : 1.0;
    const double momentum = spec_.momentum;
    for (int64_t c = 0; c < C; ++c) {
      const double meanShifted = sum[c] / count;
      const double var = std::max(squares[c] / count - meanShifted * meanShifted, 0.0);
      const double mean = static_cast<double>(shift[c]) + meanShifted;
      batchMean[c] = static_cast<float>(mean);
      batchVar[c] = static_cast<float>(var);
      runningMean[c] = static_cast<float>((1 - momentum) * runningMean[c] + momentum * mean);
      runningVar[c] = static_cast<float>((1 - momentum) * runningVar[c] + momentum * var * unbias);
    }
    normalize(x, gamma, beta, batchMean, batchVar, y);
  }

  void forwardInference(const float* x, const float* gamma, const float* beta, const float* mean, const float* var,
                        float* y) override {
    normalize(x, gamma, beta, mean, var, y);
  }

  // With batch statistics: dx = γ·σ⁻¹·(dy − Σdy/P − (x − μ)·σ⁻²·Σdy·(x − μ)/P); with fixed ones
  // (frozen batch norm) dx = γ·σ⁻¹·dy. In both, dγ = σ⁻¹·Σdy·(x − μ) and dβ = Σdy.
  void backward(const float* x, const float* dy, const float* gamma, const float* beta, const float* mean, const float* var,
                bool batchStatistics, float* dx, float* dGamma, float* dBeta) override {
    if (spec_.relu)
      backwardThrough<true>(x, dy, gamma, beta, mean, var, batchStatistics, dx, dGamma, dBeta);
    else
      backwardThrough<false>(x, dy, gamma, beta, mean, var, batchStatistics, dx, dGamma, dBeta);
  }

 private:
  // backward, where dy is the gradient of the normalised value (kRelu false) or of the fused ReLU's
  // output (kRelu true).
  template <bool kRelu>
  void backwardThrough(const float* x, const float* dy, const float* gamma, const float* beta, const float* mean, const float* var,
                       bool batchStatistics, float* dx, float* dGamma, float* dBeta) {
    const int64_t C = channels_, P = positions_;
    const std::vector<float> outScales = kRelu ? scales(gamma, var) : std::vector<float>();  // the mask's
    const float* outScale = outScales.data();
    // The gradient of the normalised value, without a branch (the loops stay vectorised).
    auto gradient = [=](const float* xr, const float* dr, int64_t c) {
      const float d = dr[c];
      if constexpr (kRelu) return normalized(xr[c], mean[c], outScale[c], beta[c]) > 0.0f ? d : 0.0f;
      return d;
    };
    std::vector<double> sumDy, sumDyXc;
    channelSums(
        P, C,
        [&](int64_t p, double* f, double* g) {
          const float* xr = x + p * C;
          const float* dr = dy + p * C;
          float masked[kRelu ? kMaxFusedChannels : 1];
          if constexpr (kRelu) {
            // The row's gradients through the ReLU first, in float lanes; then summed in double.
#pragma omp simd
            for (int64_t c = 0; c < C; ++c) masked[c] = gradient(xr, dr, c);
            dr = masked;
          }
#pragma omp simd
          for (int64_t c = 0; c < C; ++c) {
            const double d = dr[c];
            f[c] += d;
            g[c] += d * (static_cast<double>(xr[c]) - static_cast<double>(mean[c]));
          }
        },
        sumDy, sumDyXc);
    const double count = static_cast<double>(P);
    std::vector<float> scale(C), meanDy(C), projection(C);
    for (int64_t c = 0; c < C; ++c) {
      const double invStd = 1.0 / std::sqrt(static_cast<double>(var[c]) + spec_.eps);
      dGamma[c] = static_cast<float>(sumDyXc[c] * invStd);
      dBeta[c] = static_cast<float>(sumDy[c]);
      scale[c] = static_cast<float>(gamma[c] * invStd);
      meanDy[c] = batchStatistics ? static_cast<float>(sumDy[c] / count) : 0.0f;
      projection[c] = batchStatistics ? static_cast<float>(sumDyXc[c] * invStd * invStd / count) : 0.0f;
    }
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < P; ++p) {
      const float* xr = x + p * C;
      const float* dr = dy + p * C;
      float* out = dx + p * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) out[c] = scale[c] * (gradient(xr, dr, c) - meanDy[c] - (xr[c] - mean[c]) * projection[c]);
    }
  }

  // Per channel γ·σ⁻¹.
  std::vector<float> scales(const float* gamma, const float* var) const {
    std::vector<float> scale(static_cast<size_t>(channels_));
    for (int64_t c = 0; c < channels_; ++c) scale[c] = static_cast<float>(gamma[c] / std::sqrt(static_cast<double>(var[c]) + spec_.eps));
    return scale;
  }

  // y = (x − μ)·γ·σ⁻¹ + β, then max(0, y) with the fused ReLU.
  void normalize(const float* x, const float* gamma, const float* beta, const float* mean, const float* var, float* y) const {
    const int64_t C = channels_, P = positions_;
    const std::vector<float> scale = scales(gamma, var);
    const bool relu = spec_.relu;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < P; ++p) {
      const float* xr = x + p * C;
      float* out = y + p * C;
#pragma omp simd
      for (int64_t c = 0; c < C; ++c) {
        const float v = normalized(xr[c], mean[c], scale[c], beta[c]);
        out[c] = (v > 0.0f) | !relu ? v : 0.0f;
      }
    }
  }

  BatchNormSpec spec_;
  int64_t positions_, channels_;
};

}  // namespace

std::unique_ptr<BatchNorm2dOp> CpuBackend::batchNorm2d(const BatchNormSpec& spec) {
  if (spec.relu && spec.channels > kMaxFusedChannels) {
    BatchNormSpec plain = spec;
    plain.relu = false;
    return std::make_unique<ReluAfterBatchNorm>(*this, spec, std::make_unique<CpuBatchNorm2d>(plain));
  }
  return std::make_unique<CpuBatchNorm2d>(spec);
}

}  // namespace accordion
