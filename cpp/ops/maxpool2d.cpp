// MaxPool2d on oneDNN; its workspace remembers where the maxima were.
#include "ops/maxpool2d.h"

#include "ops/cpu_backend.h"
#include "ops/dnnl_context.h"

namespace accordion {

namespace {

using dnnl::memory;

class CpuMaxPool2d : public MaxPool2dOp {
 public:
  explicit CpuMaxPool2d(const Pool2dSpec& spec) : spec_(spec) {
    const memory::desc src = activationDesc(spec.inputShape()), dst = activationDesc(spec.outputShape());
    const memory::dims strides{spec.stride, spec.stride}, kernel{spec.kernel, spec.kernel}, pad{spec.padding, spec.padding};
    forwardDesc_ = dnnl::pooling_forward::primitive_desc(
        dnnl::pooling_forward::desc(dnnl::prop_kind::forward_training, dnnl::algorithm::pooling_max, src, dst, strides, kernel,
                                    pad, pad),
        cpuEngine());
    forward_ = dnnl::pooling_forward(forwardDesc_);
    backward_ = dnnl::pooling_backward(dnnl::pooling_backward::primitive_desc(
        dnnl::pooling_backward::desc(dnnl::algorithm::pooling_max, src, dst, strides, kernel, pad, pad), cpuEngine(),
        forwardDesc_));
    workspace_ = memory(forwardDesc_.workspace_desc(), cpuEngine());
  }

  void forward(const float* x, float* y) override {
    forward_.execute(cpuStream(), {{DNNL_ARG_SRC, wrap(activationDesc(spec_.inputShape()), x)},
                                   {DNNL_ARG_DST, wrap(activationDesc(spec_.outputShape()), y)},
                                   {DNNL_ARG_WORKSPACE, workspace_}});
  }

  void backward(const float* dy, float* dx) override {
    backward_.execute(cpuStream(), {{DNNL_ARG_DIFF_DST, wrap(activationDesc(spec_.outputShape()), dy)},
                                    {DNNL_ARG_DIFF_SRC, wrap(activationDesc(spec_.inputShape()), dx)},
                                    {DNNL_ARG_WORKSPACE, workspace_}});
  }

 private:
  Pool2dSpec spec_;
  dnnl::pooling_forward::primitive_desc forwardDesc_;
  dnnl::pooling_forward forward_;
  dnnl::pooling_backward backward_;
  memory workspace_;
};

}  // namespace

std::unique_ptr<MaxPool2dOp> CpuBackend::maxPool2d(const Pool2dSpec& spec) { return std::make_unique<CpuMaxPool2d>(spec); }

}  // namespace accordion
