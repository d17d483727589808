// The kernel lab's checks: convolution.
#include "lab/lab.h"

namespace accordion::lab {

Conv2dSpec convolution(Dims in, int64_t out, int64_t kernel, int64_t stride, int64_t padding, bool bias) {
  return Conv2dSpec{in.n, in.c, in.h, in.w, out, kernel, stride, padding, bias};
}

// What cuDNN chose for a GPU convolution, per direction (ops/cuda_backend.h), for the check's row.
std::string algorithmsOf(const Conv2dOp& op) {
  const auto* choice = dynamic_cast<const cuda::ConvolutionChoice*>(&op);
  return choice ? choice->algorithms() : "";
}

void checkConv2d(Lab& lab) {
  struct ConvCase {
    Conv2dSpec spec;
    bool inputGradient;  // false for a network's first layer, whose dx is null
  };
  const ConvCase cases[] = {
      // CIFAR ResNet-18 at batch 128 (no bias): the stem, 3×3 convolutions of each stage, the
      // stride-2 convolutions and 1×1 shortcuts that open stages.
      {convolution({128, 3, 32, 32}, 64, 3, 1, 1, false), false},
      {convolution({128, 64, 32, 32}, 64, 3, 1, 1, false), true},
      {convolution({128, 64, 32, 32}, 128, 3, 2, 1, false), true},
      {convolution({128, 64, 32, 32}, 128, 1, 2, 0, false), true},
      {convolution({128, 128, 16, 16}, 128, 3, 1, 1, false), true},
      {convolution({128, 128, 16, 16}, 256, 3, 2, 1, false), true},
      {convolution({128, 256, 8, 8}, 512, 3, 2, 1, false), true},
      {convolution({128, 256, 8, 8}, 512, 1, 2, 0, false), true},
      {convolution({128, 512, 4, 4}, 512, 3, 1, 1, false), true},
      // VGG-19 (with bias): its first layer, a widening one, the last.
      {convolution({128, 3, 32, 32}, 64, 3, 1, 1, true), false},
      {convolution({128, 64, 16, 16}, 128, 3, 1, 1, true), true},
      {convolution({128, 512, 2, 2}, 512, 3, 1, 1, true), true},
      // The gradient test's states (test/native/gradients.test.js): VGG's first layer at batch 4, ResNet's
      // stem on 4×4 images.
      {convolution({4, 3, 32, 32}, 64, 3, 1, 1, true), false},
      {convolution({32, 3, 4, 4}, 64, 3, 1, 1, false), false},
      // Odd sizes: prime channels and extents, windows that do not tile the input.
      {convolution({1, 3, 7, 7}, 5, 3, 1, 1, true), true},
      {convolution({3, 5, 9, 11}, 7, 3, 2, 0, false), true},
      {convolution({3, 13, 17, 19}, 6, 1, 2, 0, true), true},
      {convolution({1, 1, 1, 1}, 1, 1, 1, 0, false), true},
      {convolution({2, 4, 5, 5}, 3, 3, 1, 0, true), false},
      {convolution({3, 2, 6, 6}, 3, 3, 2, 1, false), true},
  };
  // Each case with accurate convolutions (no transform algorithms), then as training chooses by
  // default (the fastest, transforms included), then the training shapes (batch 128) on TF32
  // tensor cores (--tf32) and in bf16 (--precision bf16, against the CPU's bf16). On NHWC activations
  // (the lab's second pass) all but the fastest choice, whose transform algorithms are NCHW's.
  struct Mode {
    bool accurate, tf32, bf16;
    const char* label;
    double tolerance;
  };
  for (const Mode mode : {Mode{true, false, false, "", kMatmul}, Mode{false, false, false, ", fastest", kTransformConvolution},
                          Mode{false, true, false, ", tf32", kTf32}, Mode{false, false, true, ", bf16", kBf16Result}})
  for (const ConvCase& c : cases) {
    if ((mode.tf32 || mode.bf16) && c.spec.batch != 128) continue;
    if (lab.gpu.channelsLast() && !mode.accurate && !mode.tf32 && !mode.bf16) continue;
    lab.gpu.options.accurateConvolutions = mode.accurate;
    lab.gpu.options.tf32 = mode.tf32;
    lab.cpu.options.compute = lab.gpu.options.compute = mode.bf16 ? Precision::Bf16 : Precision::Fp32;
    const double tolerance = mode.tolerance;
    const Conv2dSpec& spec = c.spec;
    const Dims in{spec.batch, spec.inChannels, spec.height, spec.width},
        out{spec.batch, spec.outChannels, spec.outHeight(), spec.outWidth()};
    const std::string label = in.label() + " " + std::to_string(spec.inChannels) + "->" + std::to_string(spec.outChannels) + " k" +
                              std::to_string(spec.kernel) + " s" + std::to_string(spec.stride) + " p" + std::to_string(spec.padding) +
                              (spec.bias ? " +bias" : "") + mode.label;
    const double flops = 2.0 * out.numel() * spec.inChannels * spec.kernel * spec.kernel;  // per pass
    const int64_t weights = numelOf(spec.weightShape());
    // He initialisation keeps the outputs of order one whatever the fan-in.
    const float weightScale = std::sqrt(2.0f / static_cast<float>(spec.inChannels * spec.kernel * spec.kernel));
    lab.run("conv2d.forward", label, tolerance, [&](Check& check) {
      TwinOp<Conv2dOp> conv{lab.cpu.conv2d(spec), lab.gpu.conv2d(spec)};
      check.note = algorithmsOf(*conv.gpu);
      Twin<float> x = lab.input(lab.random.normal(in.numel()), in), weight = lab.input(lab.random.normal(weights, 0, weightScale)),
                  bias = spec.bias ? lab.input(lab.random.normal(spec.outChannels)) : Twin<float>{}, y = lab.activation(out);
      auto op = [&](Backend& b) { conv.on(b).forward(x.on(b), weight.on(b), bias.on(b), y.on(b)); };
      lab.both(op, y);
      lab.expect(check, "y", y);
      lab.measure(check, op, Work::compute(flops));
    });
    lab.run("conv2d.backward", label + (c.inputGradient ? "" : ", dx null"), tolerance, [&](Check& check) {
      TwinOp<Conv2dOp> conv{lab.cpu.conv2d(spec), lab.gpu.conv2d(spec)};
      check.note = algorithmsOf(*conv.gpu);
      Twin<float> x = lab.input(lab.random.normal(in.numel()), in), weight = lab.input(lab.random.normal(weights, 0, weightScale)),
                  dy = lab.input(lab.random.normal(out.numel()), out);
      Twin<float> dx = c.inputGradient ? lab.activation(in) : Twin<float>{}, dWeight = lab.empty<float>(weights),
                  dBias = spec.bias ? lab.empty<float>(spec.outChannels) : Twin<float>{};
      auto op = [&](Backend& b) { conv.on(b).backward(x.on(b), weight.on(b), dy.on(b), dx.on(b), dWeight.on(b), dBias.on(b)); };
      lab.both(op, dx, dWeight, dBias);
      if (c.inputGradient) lab.expect(check, "dx", dx);
      lab.expect(check, "dWeight", dWeight);
      if (spec.bias) lab.expect(check, "dBias", dBias);
      lab.measure(check, op, Work::compute(c.inputGradient ? 2 * flops : flops));  // dW, and dx when asked
    });
  }
  lab.gpu.options.accurateConvolutions = false;
  lab.gpu.options.tf32 = false;
  lab.cpu.options.compute = lab.gpu.options.compute = Precision::Fp32;
}

}  // namespace accordion::lab
