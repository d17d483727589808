// Conv2d on cuDNN: NCHW fp32 with FMA math (no TF32, as PyTorch with allow_tf32=False), or with
// options.tf32 cuDNN's default math (TF32 tensor cores, as allow_tf32=True). Each direction runs the
// algorithm cuDNN measured fastest for the shape when the op was made among those whose math is
// allowed (and, for accurate convolutions, that use no transform), its workspace taken from the
// device's pool for the call: on Ampere and later, cuDNN may list algorithms that use TF32 tensor
// cores even for a descriptor set to FMA math, and without tf32 those are passed over. With bf16
// compute (--precision bf16) the tensors are bf16 copies, rounded as the CPU rounds them, summed in
// fp32 on the tensor cores (cuDNN's bf16 configuration with tensor-op math, as PyTorch sets for bf16:
// under the default math cuDNN ran every bf16 convolution on the CUDA cores, and on an H200 its
// channels-last backward-data took 7-19 ms a 3x3 call): each direction writes bf16, widened to the fp32
// the layers keep, as PyTorch's autocast writes a convolution's output and gradients in bf16.
// On channels-last activations (NHWC) the filter is channels-last too (cuDNN's KRSC, as PyTorch's
// channels_last weights): the OIHW parameter is transposed into a copy for each call that reads
// it, and the weight gradient transposed back.
// What was chosen is kept (ConvolutionChoice) for the kernel lab's rows. The bias and its gradient
// are own kernels (channel_bias.cuh).
#include <algorithm>
#include <climits>
#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>

#include "core/check.h"
#include "ops/bf16.cuh"
#include "ops/channel_bias.cuh"
#include "ops/cuda_backend.h"
#include "ops/transpose.cuh"

namespace accordion::cuda {

namespace {
// Destroys whichever cuDNN descriptor it owns.
struct DestroyDescriptor {
  void operator()(cudnn::TensorDescriptor d) const { cudnn::api().destroyTensorDescriptor(d); }
  void operator()(cudnn::FilterDescriptor d) const { cudnn::api().destroyFilterDescriptor(d); }
  void operator()(cudnn::ConvolutionDescriptor d) const { cudnn::api().destroyConvolutionDescriptor(d); }
};
template <typename Descriptor>
using Owned = std::unique_ptr<std::remove_pointer_t<Descriptor>, DestroyDescriptor>;

// An algorithm of one direction and the scratch it needs.
struct Algorithm {
  int algo = 0;
  size_t workspaceBytes = 0;
};

// An algorithm's name in one direction's list, or its number when the list does not have it.
template <size_t N>
std::string algorithmName(const char* const (&names)[N], int algo) {
  return algo >= 0 && static_cast<size_t>(algo) < N ? names[algo] : "algorithm " + std::to_string(algo);
}

std::string mathName(int mathType) { return algorithmName(cudnn::kMathTypes, mathType); }

class CudaConv2d : public Conv2dOp, public ConvolutionChoice {
 public:
  CudaConv2d(CudaBackend& backend, const Conv2dSpec& spec) : backend_(backend), dnn_(cudnn::api()), spec_(spec) {
    // cuDNN's 4-d descriptors hold int strides: no tensor may reach 2³¹ elements, which also keeps
    // every dimension, and the kernels' channel and plane sizes, in int.
    const int64_t largest = std::max({numelOf(spec.inputShape()), numelOf(spec.outputShape()), numelOf(spec.weightShape())});
    if (largest > INT_MAX) throw invalidArgument(describe() + " has a tensor of 2^31 or more elements, beyond cuDNN's limit");
    const int n = static_cast<int>(spec.batch), inChannels = static_cast<int>(spec.inChannels);
    const int outChannels = static_cast<int>(spec.outChannels), kernel = static_cast<int>(spec.kernel);
    const int stride = static_cast<int>(spec.stride), padding = static_cast<int>(spec.padding);

    bf16_ = backend.options.compute == Precision::Bf16;
    channelsLast_ = backend.channelsLast();
    x_ = tensorDescriptor(n, inChannels, static_cast<int>(spec.height), static_cast<int>(spec.width));
    y_ = tensorDescriptor(n, outChannels, static_cast<int>(spec.outHeight()), static_cast<int>(spec.outWidth()));
    cudnn::FilterDescriptor w = nullptr;
    checkCudnn(dnn_.createFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
    w_.reset(w);
    checkCudnn(dnn_.setFilter4dDescriptor(w, dataType(), format(), outChannels, inChannels, kernel, kernel),
               "cudnnSetFilter4dDescriptor");
    cudnn::ConvolutionDescriptor conv = nullptr;
    checkCudnn(dnn_.createConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
    conv_.reset(conv);
    checkCudnn(dnn_.setConvolution2dDescriptor(conv, padding, padding, stride, stride, 1, 1, cudnn::kCrossCorrelation, cudnn::kFloat),
               "cudnnSetConvolution2dDescriptor");
    checkCudnn(dnn_.setConvolutionMathType(conv, bf16_ ? cudnn::kTensorOpMath : backend.options.tf32 ? cudnn::kDefaultMath : cudnn::kFmaMath),
               "cudnnSetConvolutionMathType");

    // The find functions run every algorithm on the handle's stream, on memory of cuDNN's own.
    const cudnn::Handle handle = backend.cudnn();
    forward_ = fastest("forward", cudnn::kForwardAlgorithms, [&](int requested, int* returned, cudnn::AlgoPerf* results) {
      return dnn_.findConvolutionForwardAlgorithm(handle, x_.get(), w_.get(), conv_.get(), y_.get(), requested, returned, results);
    });
    backwardData_ =
        fastest("backward-data", cudnn::kBackwardDataAlgorithms, [&](int requested, int* returned, cudnn::AlgoPerf* results) {
          return dnn_.findConvolutionBackwardDataAlgorithm(handle, w_.get(), y_.get(), conv_.get(), x_.get(), requested, returned,
                                                           results);
        });
    backwardFilter_ =
        fastest("backward-filter", cudnn::kBackwardFilterAlgorithms, [&](int requested, int* returned, cudnn::AlgoPerf* results) {
          return dnn_.findConvolutionBackwardFilterAlgorithm(handle, x_.get(), y_.get(), conv_.get(), w_.get(), requested, returned,
                                                             results);
        });

    if (spec.bias) {
      const int64_t plane = spec.outHeight() * spec.outWidth();
      bias_ = channelsLast_ ? std::make_unique<ChannelBias>(backend, spec.batch * plane, outChannels, 1)
                            : std::make_unique<ChannelBias>(backend, spec.batch, outChannels, static_cast<int>(plane));
    }
  }

  void forward(const float* x, const float* weight, const float* bias, float* y) override {
    const float one = 1, zero = 0;
    const Operand x16 = operand(x, spec_.inputShape()), w16 = filter(weight);
    const Result y16 = result(y, spec_.outputShape());
    const std::shared_ptr<void> workspace = backend_.scratch(forward_.workspaceBytes);
    checkCudnn(dnn_.convolutionForward(backend_.cudnn(), &one, x_.get(), x16.data, w_.get(), w16.data, conv_.get(), forward_.algo,
                                       workspace.get(), forward_.workspaceBytes, &zero, y_.get(), y16.data),
               "cudnnConvolutionForward");
    y16.finish(backend_);
    if (bias_) bias_->add(y, bias);
  }

  void backward(const float* x, const float* weight, const float* dy, float* dx, float* dWeight, float* dBias) override {
    const float one = 1, zero = 0;
    const Operand dy16 = operand(dy, spec_.outputShape());
    if (dx) {
      const Operand w16 = filter(weight);
      const Result dx16 = result(dx, spec_.inputShape());
      const std::shared_ptr<void> workspace = backend_.scratch(backwardData_.workspaceBytes);
      checkCudnn(dnn_.convolutionBackwardData(backend_.cudnn(), &one, w_.get(), w16.data, y_.get(), dy16.data, conv_.get(),
                                              backwardData_.algo, workspace.get(), backwardData_.workspaceBytes, &zero, x_.get(), dx16.data),
                 "cudnnConvolutionBackwardData");
      dx16.finish(backend_);
    }
    {
      const Operand x16 = operand(x, spec_.inputShape());
      const Result dw16 = filterGradient(dWeight);
      const std::shared_ptr<void> workspace = backend_.scratch(backwardFilter_.workspaceBytes);
      checkCudnn(dnn_.convolutionBackwardFilter(backend_.cudnn(), &one, x_.get(), x16.data, y_.get(), dy16.data, conv_.get(),
                                                backwardFilter_.algo, workspace.get(), backwardFilter_.workspaceBytes, &zero, w_.get(),
                                                dw16.data),
                 "cudnnConvolutionBackwardFilter");
      dw16.finish(backend_);
    }
    if (bias_) bias_->gradient(dy, dBias);
  }

  const std::string& algorithms() const override { return algorithms_; }

 private:
  // The tensors' and the filter's data type and layout for cuDNN (the sums are fp32 either way).
  int dataType() const { return bf16_ ? cudnn::kBfloat16 : cudnn::kFloat; }
  Element element() const { return bf16_ ? Element::Bf16 : Element::Fp32; }
  int format() const { return channelsLast_ ? cudnn::kNhwc : cudnn::kNchw; }
  // The filter (O, I, k, k) as (O, I, k·k): transposed into and out of channels-last's (O, k·k, I).
  int64_t taps() const { return spec_.kernel * spec_.kernel; }

  // What cuDNN reads: the fp32 tensor itself, or in bf16 compute its bf16 copy.
  struct Operand {
    std::shared_ptr<void> copy;
    const void* data;
  };
  Operand operand(const float* x, const Shape& shape) {
    if (!bf16_) return {nullptr, x};
    Operand o;
    o.data = backend_.bf16Operand(x, numelOf(shape), o.copy);  // a weight's: the step's kept copy
    return o;
  }
  // What cuDNN reads as the filter: the weight as an operand, or on channels-last activations its
  // channels-last copy (in bf16 compute rounded on the way; not the step's kept copy, which is OIHW).
  Operand filter(const float* weight) {
    if (!channelsLast_) return operand(weight, spec_.weightShape());
    Operand o;
    o.copy = backend_.allocate(static_cast<size_t>(numelOf(spec_.weightShape())) * (bf16_ ? sizeof(uint16_t) : sizeof(float)));
    transposeBatched(backend_, weight, Element::Fp32, o.copy.get(), element(), spec_.outChannels, spec_.inChannels, taps());
    o.data = o.copy.get();
    return o;
  }
  // Where cuDNN writes: the fp32 tensor itself, or storage finished into it afterwards: bf16 widened
  // (bf16 compute), a channels-last filter gradient transposed back (and widened).
  struct Result {
    std::shared_ptr<void> storage;
    void* data;
    float* target;
    int64_t n;
    bool bf16, filter;
    const CudaConv2d* op;
    void finish(CudaBackend& backend) const {
      if (!storage) return;
      if (filter)
        transposeBatched(backend, storage.get(), bf16 ? Element::Bf16 : Element::Fp32, target, Element::Fp32, op->spec_.outChannels,
                         op->taps(), op->spec_.inChannels);
      else
        widenBf16(backend, storage.get(), target, n);
    }
  };
  Result result(float* y, const Shape& shape) {
    if (!bf16_) return {nullptr, y, y, 0, false, false, this};
    const int64_t n = numelOf(shape);
    std::shared_ptr<void> storage = bf16Storage(backend_, n);
    return {storage, storage.get(), y, n, true, false, this};
  }
  Result filterGradient(float* dWeight) {
    if (!channelsLast_) return result(dWeight, spec_.weightShape());
    const int64_t n = numelOf(spec_.weightShape());
    std::shared_ptr<void> storage = backend_.allocate(static_cast<size_t>(n) * (bf16_ ? sizeof(uint16_t) : sizeof(float)));
    return {storage, storage.get(), dWeight, n, bf16_, true, this};
  }

  std::string describe() const {
    return "conv2d of x " + shapeString(spec_.inputShape()) + " into y " + shapeString(spec_.outputShape()) + " (kernel " +
           std::to_string(spec_.kernel) + ", stride " + std::to_string(spec_.stride) + ", padding " + std::to_string(spec_.padding) +
           (channelsLast_ ? ", channels-last" : "") + ")";
  }

  // Errors name the shape; the message is built only on failure.
  void checkCudnn(cudnn::Status status, const char* call) const {
    if (status != cudnn::kSuccess) cudnn::check(status, (std::string(call) + " for " + describe()).c_str());
  }

  Owned<cudnn::TensorDescriptor> tensorDescriptor(int n, int c, int h, int w) const {
    cudnn::TensorDescriptor raw = nullptr;
    checkCudnn(dnn_.createTensorDescriptor(&raw), "cudnnCreateTensorDescriptor");
    Owned<cudnn::TensorDescriptor> owned(raw);
    checkCudnn(dnn_.setTensor4dDescriptor(raw, format(), dataType(), n, c, h, w), "cudnnSetTensor4dDescriptor");
    return owned;
  }

  // cuDNN lists the algorithms it timed fastest first; some may have failed (unsupported for the
  // shape, or out of memory for their scratch), and some may use another math than FMA (TF32 tensor
  // cores): the first that ran with an allowed math (FMA; any with tf32 or bf16) and is not passed
  // over is taken, and noted in algorithms_ with the faster ones passed over. Passed over:
  // - with accurate convolutions (BackendOptions), the transform algorithms (FFT, FFT_TILING,
  //   WINOGRAD_NONFUSED): their rounding grows with the transform, and on an H200 the first
  //   convolution of VGG-19bn at batch 4 (3 -> 64 channels, 32x32) gave a weight gradient 2e-3 away
  //   from float64 where the others stay within 1e-4;
  // - in bf16, the backward ALGO_0s, which add their partial sums atomically into the result, here
  //   bf16, so that every addition rounds to bf16: on an H200 every kernel-lab row that ran one in
  //   bf16 missed the bound of one bf16 rounding of an fp32 sum (errors 5.5e-3 to 3.6e-2; a weight
  //   gradient of 772 where float64 gives 746.36), and every other row met it.
  template <size_t N, typename Find>
  Algorithm fastest(const char* direction, const char* const (&names)[N], Find find) {
    cudnn::AlgoPerf results[cudnn::kAlgorithmCount] = {};
    int returned = 0;
    checkCudnn(find(cudnn::kAlgorithmCount, &returned, results), (std::string("finding the ") + direction + " algorithm").c_str());
    std::string others;  // what was passed over, fastest first
    const bool accurate = backend_.options.accurateConvolutions, tensorCores = backend_.options.tf32 || bf16_;
    const bool backward = std::string(direction) != "forward";
    for (int i = 0; i < returned; ++i) {
      const cudnn::AlgoPerf& r = results[i];
      const std::string name = algorithmName(names, r.algo);
      const bool transform = name.find("FFT") != std::string::npos || name == "WINOGRAD_NONFUSED";
      const std::string passedOver = r.status != cudnn::kSuccess                   ? "status " + std::to_string(r.status)
                                     : r.mathType != cudnn::kFmaMath && !tensorCores ? "its math"
                                     : transform && accurate                         ? "a transform"
                                     : bf16_ && backward && name == "ALGO_0"         ? "bf16 atomics"
                                                                                     : "";
      char timing[64];
      std::snprintf(timing, sizeof timing, "%.3f ms, %zu B scratch", static_cast<double>(r.time), r.memory);
      const std::string described = r.status != cudnn::kSuccess ? name : name + " (" + mathName(r.mathType) + ", " + timing + ")";
      if (passedOver.empty()) {
        algorithms_ += (algorithms_.empty() ? "" : "; ") + std::string(direction) + " " + described +
                       (others.empty() ? "" : " [passed over: " + others + "]");
        return {r.algo, r.memory};
      }
      others += (others.empty() ? "" : ", ") + described + ": " + passedOver;
    }
    throw EngineError("ERR_CUDNN", "cuDNN has no " + std::string(direction) + " algorithm" + (tensorCores ? "" : " with FMA math") +
                                       (accurate ? " and no transform" : "") + (bf16_ && backward ? " other than ALGO_0" : "") + " that runs " +
                                       describe() + " (" + std::to_string(returned) + " tried" + (others.empty() ? "" : ": " + others) + ")");
  }

  CudaBackend& backend_;
  const cudnn::Api& dnn_;
  Conv2dSpec spec_;
  Owned<cudnn::TensorDescriptor> x_, y_;  // (N, C_in, H, W), (N, C_out, OH, OW)
  Owned<cudnn::FilterDescriptor> w_;      // (C_out, C_in, k, k)
  Owned<cudnn::ConvolutionDescriptor> conv_;
  bool bf16_ = false;  // bf16 compute: cuDNN reads and writes bf16 copies
  bool channelsLast_ = false;  // NHWC activations and a KRSC filter
  Algorithm forward_, backwardData_, backwardFilter_;
  std::string algorithms_;  // what fastest() chose per direction
  std::unique_ptr<ChannelBias> bias_;  // with a bias
};

}  // namespace

std::unique_ptr<Conv2dOp> CudaBackend::conv2d(const Conv2dSpec& spec) { return std::make_unique<CudaConv2d>(*this, spec); }

}  // namespace accordion::cuda
