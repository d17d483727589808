// BatchNorm2d on oneDNN. oneDNN returns the batch mean and biased variance; the running variance
// uses the unbiased estimate, as PyTorch does.
#include "ops/batchnorm2d.h"

#include "ops/cpu_backend.h"
#include "ops/dnnl_context.h"

namespace accordion {

namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;

class CpuBatchNorm2d : public BatchNorm2dOp {
 public:
  explicit CpuBatchNorm2d(const BatchNormSpec& spec) : spec_(spec) {}

  void forwardTraining(const float* x, const float* gamma, const float* beta, float* y, float* batchMean, float* batchVar,
                       float* runningMean, float* runningVar) override {
    run(plan(true).forward, x, gamma, beta, batchMean, batchVar, y);
    const int64_t channels = spec_.channels, count = spec_.batch * spec_.height * spec_.width;
    const float unbias = count > 1 ? static_cast<float>(count) / static_cast<float>(count - 1) : 1.0f;
    const float momentum = spec_.momentum;
    for (int64_t c = 0; c < channels; ++c) {
      runningMean[c] = (1 - momentum) * runningMean[c] + momentum * batchMean[c];
      runningVar[c] = (1 - momentum) * runningVar[c] + momentum * batchVar[c] * unbias;
    }
  }

  void forwardInference(const float* x, const float* gamma, const float* beta, const float* mean, const float* var,
                        float* y) override {
    run(plan(false).forward, x, gamma, beta, mean, var, y);
  }

  void backward(const float* x, const float* dy, const float* gamma, const float* beta, const float* mean, const float* var,
                bool batchStatistics, float* dx, float* dGamma, float* dBeta) override {
    const memory::desc data = activationDesc(spec_.shape()), channel = plainDesc({spec_.channels}, tag::x);
    plan(batchStatistics)
        .backward.execute(cpuStream(), {{DNNL_ARG_SRC, wrap(data, x)},
                                        {DNNL_ARG_DIFF_DST, wrap(data, dy)},
                                        {DNNL_ARG_MEAN, wrap(channel, mean)},
                                        {DNNL_ARG_VARIANCE, wrap(channel, var)},
                                        {DNNL_ARG_SCALE, wrap(channel, gamma)},
                                        {DNNL_ARG_SHIFT, wrap(channel, beta)},
                                        {DNNL_ARG_DIFF_SRC, wrap(data, dx)},
                                        {DNNL_ARG_DIFF_SCALE, wrap(channel, dGamma)},
                                        {DNNL_ARG_DIFF_SHIFT, wrap(channel, dBeta)}});
  }

 private:
  struct Plan {
    dnnl::batch_normalization_forward forward;
    dnnl::batch_normalization_backward backward;
  };

  // Training (batch statistics) and inference (global statistics) need different primitives.
  Plan& plan(bool training) {
    std::unique_ptr<Plan>& slot = training ? training_ : inference_;
    if (slot) return *slot;
    const memory::desc data = activationDesc(spec_.shape());
    auto flags = dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
    if (!training) flags = flags | dnnl::normalization_flags::use_global_stats;
    const auto kind = training ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    auto forwardDesc = dnnl::batch_normalization_forward::primitive_desc(
        dnnl::batch_normalization_forward::desc(kind, data, spec_.eps, flags), cpuEngine());
    auto backwardDesc = dnnl::batch_normalization_backward::primitive_desc(
        dnnl::batch_normalization_backward::desc(dnnl::prop_kind::backward, data, data, spec_.eps, flags), cpuEngine(),
        forwardDesc);
    slot = std::make_unique<Plan>(Plan{dnnl::batch_normalization_forward(forwardDesc), dnnl::batch_normalization_backward(backwardDesc)});
    return *slot;
  }

  void run(dnnl::batch_normalization_forward& forward, const float* x, const float* gamma, const float* beta, const float* mean,
           const float* var, float* y) {
    const memory::desc data = activationDesc(spec_.shape()), channel = plainDesc({spec_.channels}, tag::x);
    forward.execute(cpuStream(), {{DNNL_ARG_SRC, wrap(data, x)},
                                  {DNNL_ARG_DST, wrap(data, y)},
                                  {DNNL_ARG_SCALE, wrap(channel, gamma)},
                                  {DNNL_ARG_SHIFT, wrap(channel, beta)},
                                  {DNNL_ARG_MEAN, wrap(channel, mean)},
                                  {DNNL_ARG_VARIANCE, wrap(channel, var)}});
  }

  BatchNormSpec spec_;
  std::unique_ptr<Plan> training_, inference_;
};

}  // namespace

std::unique_ptr<BatchNorm2dOp> CpuBackend::batchNorm2d(const BatchNormSpec& spec) { return std::make_unique<CpuBatchNorm2d>(spec); }

}  // namespace accordion
