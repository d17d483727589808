// Conv2d on oneDNN. Activations are given to oneDNN as NHWC; the weight layout is left to oneDNN
// (format "any") and the PyTorch-layout parameter is reordered into it once per pass.
#include "ops/conv2d.h"

#include "ops/cpu_backend.h"
#include "ops/dnnl_context.h"

namespace accordion {

namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;

class CpuConv2d : public Conv2dOp {
 public:
  explicit CpuConv2d(const Conv2dSpec& spec) : spec_(spec) {
    const memory::desc src = activationDesc(spec.inputShape()), dst = activationDesc(spec.outputShape());
    const memory::desc weightsAny(dimsOf(spec.weightShape()), memory::data_type::f32, tag::any);
    const memory::desc biasDesc = spec.bias ? plainDesc({spec.outChannels}, tag::x) : memory::desc();
    const memory::dims strides{spec.stride, spec.stride}, pad{spec.padding, spec.padding};
    const auto algo = dnnl::algorithm::convolution_direct;
    forwardDesc_ = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src, weightsAny, biasDesc, dst, strides, pad, pad),
        cpuEngine());
    forward_ = dnnl::convolution_forward(forwardDesc_);
    backwardDataDesc_ = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(algo, src, weightsAny, dst, strides, pad, pad), cpuEngine(), forwardDesc_);
    backwardData_ = dnnl::convolution_backward_data(backwardDataDesc_);
    backwardWeightsDesc_ = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(algo, src, weightsAny, biasDesc, dst, strides, pad, pad), cpuEngine(),
        forwardDesc_);
    backwardWeights_ = dnnl::convolution_backward_weights(backwardWeightsDesc_);
  }

  void forward(const float* x, const float* weight, const float* bias, float* y) override {
    memory weights = weightForForward_(wrap(plainDesc(spec_.weightShape(), tag::oihw), weight), forwardDesc_.weights_desc());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(forwardDesc_.src_desc(), x)},
                                         {DNNL_ARG_WEIGHTS, weights},
                                         {DNNL_ARG_DST, wrap(forwardDesc_.dst_desc(), y)}};
    if (spec_.bias) args[DNNL_ARG_BIAS] = wrap(plainDesc({spec_.outChannels}, tag::x), bias);
    forward_.execute(cpuStream(), args);
  }

  void backward(const float* x, const float* weight, const float* dy, float* dx, float* dWeight, float* dBias) override {
    memory diffDst = wrap(activationDesc(spec_.outputShape()), dy);
    if (dx) {
      memory weights =
          weightForBackward_(wrap(plainDesc(spec_.weightShape(), tag::oihw), weight), backwardDataDesc_.weights_desc());
      backwardData_.execute(cpuStream(), {{DNNL_ARG_DIFF_DST, diffDst},
                                          {DNNL_ARG_WEIGHTS, weights},
                                          {DNNL_ARG_DIFF_SRC, wrap(backwardDataDesc_.diff_src_desc(), dx)}});
    }
    memory userGradWeight = wrap(plainDesc(spec_.weightShape(), tag::oihw), dWeight);
    const memory::desc gradWeightDesc = backwardWeightsDesc_.diff_weights_desc();
    memory gradWeight = gradWeightDesc == userGradWeight.get_desc() ? userGradWeight : memory(gradWeightDesc, cpuEngine());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(activationDesc(spec_.inputShape()), x)},
                                         {DNNL_ARG_DIFF_DST, diffDst},
                                         {DNNL_ARG_DIFF_WEIGHTS, gradWeight}};
    if (spec_.bias) args[DNNL_ARG_DIFF_BIAS] = wrap(plainDesc({spec_.outChannels}, tag::x), dBias);
    backwardWeights_.execute(cpuStream(), args);
    if (gradWeight != userGradWeight) gradWeightOut_.into(gradWeight, userGradWeight);
  }

 private:
  Conv2dSpec spec_;
  dnnl::convolution_forward::primitive_desc forwardDesc_;
  dnnl::convolution_forward forward_;
  dnnl::convolution_backward_data::primitive_desc backwardDataDesc_;
  dnnl::convolution_backward_data backwardData_;
  dnnl::convolution_backward_weights::primitive_desc backwardWeightsDesc_;
  dnnl::convolution_backward_weights backwardWeights_;
  CachedReorder weightForForward_, weightForBackward_, gradWeightOut_;
};

}  // namespace

std::unique_ptr<Conv2dOp> CpuBackend::conv2d(const Conv2dSpec& spec) { return std::make_unique<CpuConv2d>(spec); }

}  // namespace accordion
