// Conv2d on oneDNN. Activations are given to oneDNN as NHWC; the weight layout is left to oneDNN
// (format "any") and the PyTorch-layout parameter is reordered into it once per pass. In bf16
// (BackendOptions::compute) the input, the weights and the output's gradient are rounded to bf16 on
// their way in (the input once, for the forward and the weights' gradient), and the output, the
// input's gradient and the weights' gradient come out in fp32: natively through oneDNN's bf16
// primitives, or as fp32 primitives over rounded values on a CPU without bf16 instructions
// (ops/cpu_bf16.h).
#include "ops/conv2d.h"

#include <vector>

#include "ops/cpu_backend.h"
#include "ops/cpu_bf16.h"
#include "ops/dnnl_context.h"

namespace accordion {

namespace {

using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

class CpuConv2d : public Conv2dOp {
 public:
  CpuConv2d(const Conv2dSpec& spec, bool bf16) : spec_(spec), round_(bf16 && cpuBf16Compute() == Bf16Compute::Rounded) {
    // What goes into the products: bf16 natively, else fp32 (rounded first when round_).
    const dt in = bf16 && !round_ ? dt::bf16 : dt::f32;
    const memory::desc src = activationDesc(spec.inputShape(), in), dst = activationDesc(spec.outputShape());
    const memory::desc diffSrc = activationDesc(spec.inputShape()), diffDst = activationDesc(spec.outputShape(), in);
    const memory::desc weightsAny(dimsOf(spec.weightShape()), in, tag::any), diffWeightsAny(dimsOf(spec.weightShape()), dt::f32, tag::any);
    const memory::desc biasDesc = spec.bias ? plainDesc({spec.outChannels}, tag::x) : memory::desc();
    const memory::dims strides{spec.stride, spec.stride}, pad{spec.padding, spec.padding};
    const auto algo = dnnl::algorithm::convolution_direct;
    forwardDesc_ = dnnl::convolution_forward::primitive_desc(
        dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training, algo, src, weightsAny, biasDesc, dst, strides, pad, pad),
        cpuEngine());
    forward_ = dnnl::convolution_forward(forwardDesc_);
    backwardDataDesc_ = dnnl::convolution_backward_data::primitive_desc(
        dnnl::convolution_backward_data::desc(algo, diffSrc, weightsAny, diffDst, strides, pad, pad), cpuEngine(), forwardDesc_);
    backwardData_ = dnnl::convolution_backward_data(backwardDataDesc_);
    backwardWeightsDesc_ = dnnl::convolution_backward_weights::primitive_desc(
        dnnl::convolution_backward_weights::desc(algo, src, diffWeightsAny, biasDesc, diffDst, strides, pad, pad), cpuEngine(),
        forwardDesc_);
    backwardWeights_ = dnnl::convolution_backward_weights(backwardWeightsDesc_);
  }

  void forward(const float* x, const float* weight, const float* bias, float* y) override {
    memory weights = weightForForward_(input(weight, spec_.weightShape(), roundedWeight_, true), forwardDesc_.weights_desc());
    src_ = srcForForward_(input(x, spec_.inputShape(), roundedSrc_), forwardDesc_.src_desc());
    srcOf_ = x;
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src_},
                                         {DNNL_ARG_WEIGHTS, weights},
                                         {DNNL_ARG_DST, wrap(forwardDesc_.dst_desc(), y)}};
    if (spec_.bias) args[DNNL_ARG_BIAS] = wrap(plainDesc({spec_.outChannels}, tag::x), bias);
    forward_.execute(cpuStream(), args);
  }

  void backward(const float* x, const float* weight, const float* dy, float* dx, float* dWeight, float* dBias) override {
    memory diffDst = diffDstIn_(input(dy, spec_.outputShape(), roundedDiffDst_), backwardDataDesc_.diff_dst_desc());
    if (dx) {
      memory weights = weightForBackward_(input(weight, spec_.weightShape(), roundedWeight_, true), backwardDataDesc_.weights_desc());
      backwardData_.execute(cpuStream(), {{DNNL_ARG_DIFF_DST, diffDst},
                                          {DNNL_ARG_WEIGHTS, weights},
                                          {DNNL_ARG_DIFF_SRC, wrap(backwardDataDesc_.diff_src_desc(), dx)}});
    }
    memory userGradWeight = wrap(plainDesc(spec_.weightShape(), tag::oihw), dWeight);
    const memory::desc gradWeightDesc = backwardWeightsDesc_.diff_weights_desc();
    memory gradWeight = gradWeightDesc == userGradWeight.get_desc() ? userGradWeight : memory(gradWeightDesc, cpuEngine());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, backwardSrc(x)},
                                         {DNNL_ARG_DIFF_DST, diffDst},
                                         {DNNL_ARG_DIFF_WEIGHTS, gradWeight}};
    if (spec_.bias) args[DNNL_ARG_DIFF_BIAS] = wrap(plainDesc({spec_.outChannels}, tag::x), dBias);
    backwardWeights_.execute(cpuStream(), args);
    if (gradWeight != userGradWeight) gradWeightOut_.into(gradWeight, userGradWeight);
  }

 private:
  // The fp32 tensor `data` as oneDNN memory (NHWC activations, OIHW weights), rounded to bf16 into
  // `rounded` first on a CPU without bf16 instructions; the primitives' reorders convert it to
  // bf16 natively.
  memory input(const float* data, const Shape& shape, std::vector<float>& rounded, bool isWeight = false) {
    const memory::desc desc = isWeight ? plainDesc(shape, tag::oihw) : activationDesc(shape);
    if (!round_) return wrap(desc, data);
    rounded.resize(static_cast<size_t>(numelOf(shape)));
    roundToBf16(data, rounded.data(), static_cast<int64_t>(rounded.size()));
    return wrap(desc, rounded.data());
  }

  // The input as the weights' gradient takes it: the forward's converted copy when backward is given
  // the input that forward converted last (the training step's case), else converted again.
  memory backwardSrc(const float* x) {
    if (x == srcOf_ && src_.get_desc() == backwardWeightsDesc_.src_desc()) return src_;
    return srcForBackward_(input(x, spec_.inputShape(), roundedSrc_), backwardWeightsDesc_.src_desc());
  }

  Conv2dSpec spec_;
  bool round_;
  dnnl::convolution_forward::primitive_desc forwardDesc_;
  dnnl::convolution_forward forward_;
  dnnl::convolution_backward_data::primitive_desc backwardDataDesc_;
  dnnl::convolution_backward_data backwardData_;
  dnnl::convolution_backward_weights::primitive_desc backwardWeightsDesc_;
  dnnl::convolution_backward_weights backwardWeights_;
  CachedReorder weightForForward_, weightForBackward_, gradWeightOut_, srcForForward_, srcForBackward_, diffDstIn_;
  std::vector<float> roundedSrc_, roundedWeight_, roundedDiffDst_;
  memory src_;                    // the last forward's input, as it went into the product
  const float* srcOf_ = nullptr;  // ... and the input it was made from
};

}  // namespace

std::unique_ptr<Conv2dOp> CpuBackend::conv2d(const Conv2dSpec& spec) {
  return std::make_unique<CpuConv2d>(spec, options.compute == Precision::Bf16);
}

}  // namespace accordion
