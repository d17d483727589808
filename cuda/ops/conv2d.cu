// Conv2d on cuDNN: NCHW fp32 with FMA math (no TF32, as PyTorch with allow_tf32=False), or with
// options.tf32 cuDNN's default math (TF32 tensor cores, as allow_tf32=True). Each direction runs the
// algorithm cuDNN measured fastest for the shape when the op was made among those whose math is
// allowed (and, for accurate convolutions, that use no transform), its workspace taken from the
// device's pool for the call: on Ampere and later, cuDNN may list algorithms that use TF32 tensor
// cores even for a descriptor set to FMA math, and without tf32 those are passed over. With bf16
// compute (--precision bf16) the tensors are bf16 copies, rounded as the CPU rounds them, summed in
// fp32 on the tensor cores (cuDNN's bf16 configuration): each direction writes bf16, widened to the
// fp32 the layers keep, as PyTorch's autocast writes a convolution's output and gradients in bf16.
// What was chosen is kept (ConvolutionChoice) for the kernel lab's rows. The bias and its gradient
// are own kernels; the gradient sums each channel in a fixed order, so it has the same bits on every
// run.
#include <algorithm>
#include <climits>
#include <cstdio>
#include <memory>
#include <string>
#include <type_traits>

#include "core/check.h"
#include "ops/bf16.cuh"
#include "ops/cuda_backend.h"

namespace accordion::cuda {

namespace {

// Blocks per launch that keep the largest GPUs busy for a couple of waves (H100: 132 SMs × 8
// resident blocks of 256 threads); more only adds partial sums.
constexpr int64_t kTargetBlocks = 2048;
// Loads each thread issues before using them, so enough bytes are in flight to saturate memory.
constexpr int kUnroll = 4;
constexpr int kWarp = 32;
constexpr unsigned kFullWarp = 0xffffffffu;
// The grid's y dimension (channels) is at most this.
constexpr int kMaxGridY = 65535;

// Element j = n·P + p of one channel c of an NCHW tensor (N, C, P = H·W), at index n·C·P + c·P + p,
// moved on by a fixed step with additions only: a division per element would cost more than the
// memory access it addresses.
class ChannelCursor {
 public:
  __device__ ChannelCursor(int64_t j, int channel, int channels, int plane, int step)
      : plane_(plane),
        offset_(static_cast<int>(j % plane)),
        stepOffset_(step % plane),
        imageStride_(int64_t{channels} * plane),
        stepIndex_(int64_t{step / plane} * imageStride_ + step % plane),
        index_(j / plane * imageStride_ + int64_t{channel} * plane + offset_) {}

  __device__ int64_t index() const { return index_; }

  __device__ void advance() {
    offset_ += stepOffset_;
    index_ += stepIndex_;
    if (offset_ >= plane_) {  // into the next image: skip the other channels' planes
      offset_ -= plane_;
      index_ += imageStride_ - plane_;
    }
  }

 private:
  int plane_, offset_, stepOffset_;
  int64_t imageStride_, stepIndex_, index_;
};

// This thread's share of one block's slice [blockIdx.x·perBlock, +perBlock) of a channel's
// perChannel elements, the threads of the block taking every blockDim.x-th element.
struct SliceShare {
  int64_t first, count;
};

__device__ SliceShare sliceShare(int64_t perChannel, int64_t perBlock) {
  const int64_t begin = int64_t{blockIdx.x} * perBlock, end = min(perChannel, begin + perBlock);
  const int64_t first = begin + threadIdx.x;
  return {first, first < end ? (end - first + blockDim.x - 1) / blockDim.x : 0};
}

// y (N, C, P) += bias[c] per channel; blockIdx.y picks channels, blockIdx.x a slice of each.
__global__ void addChannelBias(float* __restrict__ y, const float* __restrict__ bias, int channels, int plane, int64_t perChannel,
                               int64_t perBlock) {
  for (int c = blockIdx.y; c < channels; c += gridDim.y) {
    const float b = bias[c];
    const SliceShare share = sliceShare(perChannel, perBlock);
    if (share.count == 0) continue;
    ChannelCursor at(share.first, c, channels, plane, blockDim.x);
    int64_t left = share.count;
    for (; left >= kUnroll; left -= kUnroll) {
      int64_t index[kUnroll];
      float value[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        index[u] = at.index();
        at.advance();
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) value[u] = y[index[u]];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) y[index[u]] = value[u] + b;
    }
    for (; left > 0; --left) {
      y[at.index()] += b;
      at.advance();
    }
  }
}

// The sum of every thread's value as a fixed tree (the same bits on every run), in thread 0.
__device__ double blockSum(double value) {
  __shared__ double warpSums[kThreads / kWarp];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) value += __shfl_down_sync(kFullWarp, value, offset);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) warpSums[warp] = value;
  __syncthreads();
  value = 0;
  if (warp == 0) {
    if (lane < static_cast<int>(blockDim.x / kWarp)) value = warpSums[lane];
    for (int offset = kWarp / 2; offset > 0; offset /= 2) value += __shfl_down_sync(kFullWarp, value, offset);
  }
  __syncthreads();  // warpSums is reused for the block's next channel
  return value;
}

// Σ over N·P of one slice of each channel of dy (N, C, P): in float per thread (a few dozen
// elements), in double across the block. A single slice per channel is the whole sum, written to
// dBias; otherwise partials (C, slices) hold one sum per slice for finishChannelSums.
__global__ void sumChannelSlices(const float* __restrict__ dy, int channels, int plane, int64_t perChannel, int64_t perBlock,
                                 double* __restrict__ partials, float* __restrict__ dBias) {
  for (int c = blockIdx.y; c < channels; c += gridDim.y) {
    const SliceShare share = sliceShare(perChannel, perBlock);
    float sum = 0;
    if (share.count > 0) {
      ChannelCursor at(share.first, c, channels, plane, blockDim.x);
      int64_t left = share.count;
      for (; left >= kUnroll; left -= kUnroll) {
        int64_t index[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          index[u] = at.index();
          at.advance();
        }
        float value[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) value[u] = dy[index[u]];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) sum += value[u];
      }
      for (; left > 0; --left) {
        sum += dy[at.index()];
        at.advance();
      }
    }
    const double total = blockSum(sum);
    if (threadIdx.x == 0) {
      if (gridDim.x == 1)
        dBias[c] = static_cast<float>(total);
      else
        partials[int64_t{c} * gridDim.x + blockIdx.x] = total;
    }
  }
}

// dBias[c] = Σ_s partials[c, s] in double, one warp per channel.
__global__ void finishChannelSums(const double* __restrict__ partials, int slices, int channels, float* __restrict__ dBias) {
  const int lane = threadIdx.x % kWarp;
  const int warps = gridDim.x * blockDim.x / kWarp;
  // Whole warps share a channel, so the loop and the shuffles stay warp-uniform.
  for (int c = (blockIdx.x * blockDim.x + threadIdx.x) / kWarp; c < channels; c += warps) {
    double sum = 0;
    for (int s = lane; s < slices; s += kWarp) sum += partials[int64_t{c} * slices + s];
    for (int offset = kWarp / 2; offset > 0; offset /= 2) sum += __shfl_down_sync(kFullWarp, sum, offset);
    if (lane == 0) dBias[c] = static_cast<float>(sum);
  }
}

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
    x_ = tensorDescriptor(n, inChannels, static_cast<int>(spec.height), static_cast<int>(spec.width));
    y_ = tensorDescriptor(n, outChannels, static_cast<int>(spec.outHeight()), static_cast<int>(spec.outWidth()));
    cudnn::FilterDescriptor w = nullptr;
    checkCudnn(dnn_.createFilterDescriptor(&w), "cudnnCreateFilterDescriptor");
    w_.reset(w);
    checkCudnn(dnn_.setFilter4dDescriptor(w, dataType(), cudnn::kNchw, outChannels, inChannels, kernel, kernel),
               "cudnnSetFilter4dDescriptor");
    cudnn::ConvolutionDescriptor conv = nullptr;
    checkCudnn(dnn_.createConvolutionDescriptor(&conv), "cudnnCreateConvolutionDescriptor");
    conv_.reset(conv);
    checkCudnn(dnn_.setConvolution2dDescriptor(conv, padding, padding, stride, stride, 1, 1, cudnn::kCrossCorrelation, cudnn::kFloat),
               "cudnnSetConvolution2dDescriptor");
    checkCudnn(dnn_.setConvolutionMathType(conv, backend.options.tf32 || bf16_ ? cudnn::kDefaultMath : cudnn::kFmaMath),
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
      channels_ = outChannels;
      plane_ = static_cast<int>(spec.outHeight() * spec.outWidth());
      perChannel_ = spec.batch * plane_;
      // Slices per channel: enough blocks to fill the GPU, each thread still summing several
      // elements, and then slices of equal length.
      const int64_t byWork = (perChannel_ + kThreads * kUnroll - 1) / (kThreads * kUnroll);
      const int64_t byDevice = (kTargetBlocks + channels_ - 1) / channels_;
      const int64_t slices = std::max<int64_t>(1, std::min(byWork, byDevice));
      perBlock_ = (perChannel_ + slices - 1) / slices;
      slices_ = static_cast<int>((perChannel_ + perBlock_ - 1) / perBlock_);
      if (slices_ > 1) partials_ = backend.allocate(static_cast<size_t>(slices_) * channels_ * sizeof(double));
    }
  }

  void forward(const float* x, const float* weight, const float* bias, float* y) override {
    const float one = 1, zero = 0;
    const Operand x16 = operand(x, spec_.inputShape()), w16 = operand(weight, spec_.weightShape());
    const Result y16 = result(y, spec_.outputShape());
    const std::shared_ptr<void> workspace = backend_.scratch(forward_.workspaceBytes);
    checkCudnn(dnn_.convolutionForward(backend_.cudnn(), &one, x_.get(), x16.data, w_.get(), w16.data, conv_.get(), forward_.algo,
                                       workspace.get(), forward_.workspaceBytes, &zero, y_.get(), y16.data),
               "cudnnConvolutionForward");
    y16.widen(backend_);
    if (!spec_.bias) return;
    addChannelBias<<<channelGrid(), kThreads, 0, backend_.stream()>>>(y, bias, channels_, plane_, perChannel_, perBlock_);
    checkLaunch("addChannelBias");
  }

  void backward(const float* x, const float* weight, const float* dy, float* dx, float* dWeight, float* dBias) override {
    const float one = 1, zero = 0;
    const Operand dy16 = operand(dy, spec_.outputShape());
    if (dx) {
      const Operand w16 = operand(weight, spec_.weightShape());
      const Result dx16 = result(dx, spec_.inputShape());
      const std::shared_ptr<void> workspace = backend_.scratch(backwardData_.workspaceBytes);
      checkCudnn(dnn_.convolutionBackwardData(backend_.cudnn(), &one, w_.get(), w16.data, y_.get(), dy16.data, conv_.get(),
                                              backwardData_.algo, workspace.get(), backwardData_.workspaceBytes, &zero, x_.get(), dx16.data),
                 "cudnnConvolutionBackwardData");
      dx16.widen(backend_);
    }
    {
      const Operand x16 = operand(x, spec_.inputShape());
      const Result dw16 = result(dWeight, spec_.weightShape());
      const std::shared_ptr<void> workspace = backend_.scratch(backwardFilter_.workspaceBytes);
      checkCudnn(dnn_.convolutionBackwardFilter(backend_.cudnn(), &one, x_.get(), x16.data, y_.get(), dy16.data, conv_.get(),
                                                backwardFilter_.algo, workspace.get(), backwardFilter_.workspaceBytes, &zero, w_.get(),
                                                dw16.data),
                 "cudnnConvolutionBackwardFilter");
      dw16.widen(backend_);
    }
    if (!spec_.bias) return;
    double* partials = static_cast<double*>(partials_.get());
    sumChannelSlices<<<channelGrid(), kThreads, 0, backend_.stream()>>>(dy, channels_, plane_, perChannel_, perBlock_, partials,
                                                                        dBias);
    checkLaunch("sumChannelSlices");
    if (slices_ == 1) return;
    finishChannelSums<<<blocksFor(int64_t{channels_} * kWarp), kThreads, 0, backend_.stream()>>>(partials, slices_, channels_, dBias);
    checkLaunch("finishChannelSums");
  }

  const std::string& algorithms() const override { return algorithms_; }

 private:
  // The tensors' and the filter's data type for cuDNN (the sums are fp32 either way).
  int dataType() const { return bf16_ ? cudnn::kBfloat16 : cudnn::kFloat; }

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
  // Where cuDNN writes: the fp32 tensor itself, or in bf16 compute bf16 storage widened into it.
  struct Result {
    std::shared_ptr<void> storage;
    void* data;
    float* target;
    int64_t n;
    void widen(CudaBackend& backend) const {
      if (storage) widenBf16(backend, storage.get(), target, n);
    }
  };
  Result result(float* y, const Shape& shape) {
    if (!bf16_) return {nullptr, y, y, 0};
    const int64_t n = numelOf(shape);
    std::shared_ptr<void> storage = bf16Storage(backend_, n);
    return {storage, storage.get(), y, n};
  }

  std::string describe() const {
    return "conv2d of x " + shapeString(spec_.inputShape()) + " into y " + shapeString(spec_.outputShape()) + " (kernel " +
           std::to_string(spec_.kernel) + ", stride " + std::to_string(spec_.stride) + ", padding " + std::to_string(spec_.padding) +
           ")";
  }

  // Errors name the shape; the message is built only on failure.
  void checkCudnn(cudnn::Status status, const char* call) const {
    if (status != cudnn::kSuccess) cudnn::check(status, (std::string(call) + " for " + describe()).c_str());
  }

  Owned<cudnn::TensorDescriptor> tensorDescriptor(int n, int c, int h, int w) const {
    cudnn::TensorDescriptor raw = nullptr;
    checkCudnn(dnn_.createTensorDescriptor(&raw), "cudnnCreateTensorDescriptor");
    Owned<cudnn::TensorDescriptor> owned(raw);
    checkCudnn(dnn_.setTensor4dDescriptor(raw, cudnn::kNchw, dataType(), n, c, h, w), "cudnnSetTensor4dDescriptor");
    return owned;
  }

  // cuDNN lists the algorithms it timed fastest first; some may have failed (unsupported for the
  // shape, or out of memory for their scratch), and some may use another math than FMA (TF32 tensor
  // cores): the first that ran with an allowed math (FMA; any with tf32) is taken, and noted in
  // algorithms_. With accurate
  // convolutions (BackendOptions) the transform algorithms (FFT, FFT_TILING, WINOGRAD_NONFUSED) are
  // passed over too: their rounding grows with the transform, and on an H200 the first convolution
  // of VGG-19bn at batch 4 (3 → 64 channels, 32×32) gave a weight gradient 2e-3 away from float64
  // where the others stay within 1e-4.
  template <size_t N, typename Find>
  Algorithm fastest(const char* direction, const char* const (&names)[N], Find find) {
    cudnn::AlgoPerf results[cudnn::kAlgorithmCount] = {};
    int returned = 0;
    checkCudnn(find(cudnn::kAlgorithmCount, &returned, results), (std::string("finding the ") + direction + " algorithm").c_str());
    std::string others;  // what was passed over, for the error
    const bool accurate = backend_.options.accurateConvolutions, tensorCores = backend_.options.tf32 || bf16_;
    for (int i = 0; i < returned; ++i) {
      const cudnn::AlgoPerf& r = results[i];
      const std::string name = algorithmName(names, r.algo);
      const bool transform = name.find("FFT") != std::string::npos || name == "WINOGRAD_NONFUSED";
      const bool allowed = !(transform && accurate);
      if (r.status == cudnn::kSuccess && (r.mathType == cudnn::kFmaMath || tensorCores) && allowed) {
        char timing[64];
        std::snprintf(timing, sizeof timing, "%.3f ms, %zu B scratch", static_cast<double>(r.time), r.memory);
        algorithms_ += (algorithms_.empty() ? "" : "; ") + std::string(direction) + " " + name + " (" + mathName(r.mathType) + ", " +
                       timing + ")";
        return {r.algo, r.memory};
      }
      others += (others.empty() ? "" : ", ") + name + " (" +
                (r.status != cudnn::kSuccess ? "status " + std::to_string(r.status)
                 : !allowed                  ? std::string("a transform")
                                             : mathName(r.mathType) + " math") +
                ")";
    }
    throw EngineError("ERR_CUDNN", "cuDNN has no " + std::string(direction) + " algorithm" + (tensorCores ? "" : " with FMA math") +
                                       (accurate ? " and no transform" : "") + " that runs " + describe() + " (" +
                                       std::to_string(returned) + " tried" + (others.empty() ? "" : ": " + others) + ")");
  }


  dim3 channelGrid() const {
    return dim3(static_cast<unsigned>(slices_), static_cast<unsigned>(std::min(channels_, kMaxGridY)));
  }

  CudaBackend& backend_;
  const cudnn::Api& dnn_;
  Conv2dSpec spec_;
  Owned<cudnn::TensorDescriptor> x_, y_;  // (N, C_in, H, W), (N, C_out, OH, OW)
  Owned<cudnn::FilterDescriptor> w_;      // (C_out, C_in, k, k)
  Owned<cudnn::ConvolutionDescriptor> conv_;
  bool bf16_ = false;  // bf16 compute: cuDNN reads and writes bf16 copies
  Algorithm forward_, backwardData_, backwardFilter_;
  std::string algorithms_;  // what fastest() chose per direction
  // The bias kernels' grid: slices_ blocks over each channel's perChannel_ = N·OH·OW elements.
  int channels_ = 0, plane_ = 0, slices_ = 0;
  int64_t perChannel_ = 0, perBlock_ = 0;
  std::shared_ptr<void> partials_;  // (C_out, slices_) doubles, when slices_ > 1
};

}  // namespace

std::unique_ptr<Conv2dOp> CudaBackend::conv2d(const Conv2dSpec& spec) { return std::make_unique<CudaConv2d>(*this, spec); }

}  // namespace accordion::cuda
