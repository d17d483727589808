// Max pooling over square windows, as torch.nn.MaxPool2d (padding counts as −∞), on NCHW or NHWC
// activations (the same kernels; only where a plane's elements lie differs).
//
// Forward: a thread per output scans its window row by row and keeps the first maximum (strict >),
// storing its position in the input plane (int32, in the op's scratch). NaN never wins, as with the
// CPU's strict comparison; a window with nothing above −∞ (all −∞ or NaN) outputs −∞ and points at
// its first position inside the input. Reads x once (overlapping windows share cache lines), writes
// y and the positions.
// Backward gathers: a thread per input element sums, in output order, dy of the outputs whose
// window covers it and whose maximum came from it. Deterministic, no atomics, correct for
// overlapping windows (stride < kernel); writes every dx element once.
//
// Indices are 32-bit (the op refuses tensors of 2^31 elements or more): the decomposition of flat
// indices into (plane, row, column) uses multiply-high division by the fixed sizes.
#include "ops/maxpool2d.h"

#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

// Division by a divisor fixed at launch as a multiply-high, an add and a shift (Granlund and
// Montgomery, "Division by invariant integers using multiplication"): exact for dividends < 2^31.
struct FastDivisor {
  uint32_t multiplier = 0, shift = 0;

  FastDivisor() = default;
  explicit FastDivisor(uint32_t divisor) {
    while ((uint64_t{1} << shift) < divisor) ++shift;
    multiplier = static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << shift) - divisor) / divisor + 1);
  }
  __device__ __forceinline__ uint32_t divide(uint32_t n) const { return (__umulhi(n, multiplier) + n) >> shift; }
};

struct PoolGeometry {
  int32_t channels, height, width, outHeight, outWidth, kernel, stride, padding;
  FastDivisor byChannels, byHeight, byWidth, byOutHeight, byOutWidth, byStride;
};

// Flat index i of a (N, C, rows, cols) tensor: its row and column, and where element (r, c) of its
// plane lies, at first + (r·cols + c)·step in a tensor of the same layout whose planes have
// `planeSize` elements (NCHW: a plane's elements are contiguous; NHWC: C apart).
struct Site {
  int row, column;
  uint32_t first, step;
};

template <bool kChannelsLast>
__device__ __forceinline__ Site siteOf(uint32_t i, const PoolGeometry& g, int rows, int cols, const FastDivisor& byRows,
                                       const FastDivisor& byCols, uint32_t planeSize) {
  uint32_t pixel = i, channel = 0;
  if constexpr (kChannelsLast) {
    pixel = g.byChannels.divide(i);
    channel = i - pixel * static_cast<uint32_t>(g.channels);
  }
  const uint32_t line = byCols.divide(pixel), plane = byRows.divide(line);  // plane: n·C + c (NCHW), n (NHWC)
  const int column = static_cast<int>(pixel - line * cols), row = static_cast<int>(line - plane * rows);
  if constexpr (kChannelsLast)
    return {row, column, plane * planeSize * static_cast<uint32_t>(g.channels) + channel, static_cast<uint32_t>(g.channels)};
  else
    return {row, column, plane * planeSize, 1u};
}

// kWindow: the kernel size when fixed at compile time (the window's loads then issue together), or
// 0 for any size.
template <int kWindow, bool kChannelsLast>
__global__ void __launch_bounds__(kThreads) maxPoolForward(const float* __restrict__ x, float* __restrict__ y,
                                                           int32_t* __restrict__ argmax, PoolGeometry g, uint32_t outputs) {
  const int window = kWindow > 0 ? kWindow : g.kernel;
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < outputs; i += gridDim.x * blockDim.x) {
    const Site out = siteOf<kChannelsLast>(i, g, g.outHeight, g.outWidth, g.byOutHeight, g.byOutWidth,
                                           static_cast<uint32_t>(g.height * g.width));
    const float* in = x + out.first;
    const int top = out.row * g.stride - g.padding, left = out.column * g.stride - g.padding;
    float best = -INFINITY;
    int32_t where = -1;
#pragma unroll
    for (int dh = 0; dh < window; ++dh) {
      const int h = top + dh;
      if (h < 0 || h >= g.height) continue;
#pragma unroll
      for (int dw = 0; dw < window; ++dw) {
        const int w = left + dw;
        if (w < 0 || w >= g.width) continue;
        const int at = h * g.width + w;
        const float v = in[static_cast<uint32_t>(at) * out.step];
        if (where < 0) where = at;  // kept should nothing beat −∞
        if (v > best) best = v, where = at;
      }
    }
    y[i] = best;
    argmax[i] = where;
  }
}

template <bool kChannelsLast>
__global__ void __launch_bounds__(kThreads) maxPoolBackward(const float* __restrict__ dy, const int32_t* __restrict__ argmax,
                                                            float* __restrict__ dx, PoolGeometry g, uint32_t inputs) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < inputs; i += gridDim.x * blockDim.x) {
    const Site in = siteOf<kChannelsLast>(i, g, g.height, g.width, g.byHeight, g.byWidth, static_cast<uint32_t>(g.outHeight * g.outWidth));
    const int h = in.row, w = in.column, at = h * g.width + w;
    // The outputs o whose window covers h: o·stride − padding ≤ h < o·stride − padding + kernel.
    const auto covering = [&](int position, int outSize, int& begin, int& end) {
      const int padded = position + g.padding;
      begin = padded < g.kernel ? 0 : static_cast<int>(g.byStride.divide(padded - g.kernel)) + 1;
      end = min(static_cast<int>(g.byStride.divide(padded)) + 1, outSize);
    };
    int ohBegin, ohEnd, owBegin, owEnd;
    covering(h, g.outHeight, ohBegin, ohEnd);
    covering(w, g.outWidth, owBegin, owEnd);
    float sum = 0.0f;
    for (int oh = ohBegin; oh < ohEnd; ++oh)
      for (int ow = owBegin; ow < owEnd; ++ow) {
        const uint32_t o = in.first + static_cast<uint32_t>(oh * g.outWidth + ow) * in.step;
        const float d = dy[o];  // loaded alongside argmax[o], not after it
        if (argmax[o] == at) sum += d;
      }
    dx[i] = sum;
  }
}

class CudaMaxPool2d : public MaxPool2dOp {
 public:
  CudaMaxPool2d(CudaBackend& backend, const Pool2dSpec& spec) : backend_(backend), channelsLast_(backend.channelsLast()) {
    const int64_t outHeight = spec.outHeight(), outWidth = spec.outWidth();
    if (spec.batch <= 0 || spec.channels <= 0 || spec.height <= 0 || spec.width <= 0 || spec.kernel <= 0 || spec.stride <= 0 ||
        spec.padding < 0 || outHeight <= 0 || outWidth <= 0)
      throw invalidArgument("MaxPool2d: no valid output for input " + shapeString(spec.inputShape()) + ", kernel " +
                            std::to_string(spec.kernel) + ", stride " + std::to_string(spec.stride) + ", padding " +
                            std::to_string(spec.padding));
    inputs_ = numelOf(spec.inputShape());
    outputs_ = numelOf(spec.outputShape());
    if (inputs_ > INT32_MAX || outputs_ > INT32_MAX || spec.height + 2 * spec.padding > INT32_MAX / 2 ||
        spec.width + 2 * spec.padding > INT32_MAX / 2)
      throw invalidArgument("MaxPool2d on " + shapeString(spec.inputShape()) + ": the CUDA kernels take fewer than 2^31 elements");
    const auto i32 = [](int64_t v) { return static_cast<int32_t>(v); };
    const auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
    geometry_ = {i32(spec.channels),
                 i32(spec.height),
                 i32(spec.width),
                 i32(outHeight),
                 i32(outWidth),
                 i32(spec.kernel),
                 i32(spec.stride),
                 i32(spec.padding),
                 FastDivisor(u32(spec.channels)),
                 FastDivisor(u32(spec.height)),
                 FastDivisor(u32(spec.width)),
                 FastDivisor(u32(outHeight)),
                 FastDivisor(u32(outWidth)),
                 FastDivisor(u32(spec.stride))};
    argmax_ = backend.allocate(static_cast<size_t>(outputs_) * sizeof(int32_t));
  }

  void forward(const float* x, float* y) override {
    if (channelsLast_)
      launchForward<true>(x, y);
    else
      launchForward<false>(x, y);
  }

  void backward(const float* dy, float* dx) override {
    const auto* argmax = static_cast<const int32_t*>(argmax_.get());
    const uint32_t inputs = static_cast<uint32_t>(inputs_);
    if (channelsLast_)
      maxPoolBackward<true><<<blocksFor(inputs_), kThreads, 0, backend_.stream()>>>(dy, argmax, dx, geometry_, inputs);
    else
      maxPoolBackward<false><<<blocksFor(inputs_), kThreads, 0, backend_.stream()>>>(dy, argmax, dx, geometry_, inputs);
    checkLaunch("maxPool2d backward");
  }

 private:
  template <bool kChannelsLast>
  void launchForward(const float* x, float* y) {
    auto* argmax = static_cast<int32_t*>(argmax_.get());
    const unsigned blocks = blocksFor(outputs_);
    const uint32_t outputs = static_cast<uint32_t>(outputs_);
    if (geometry_.kernel == 2)
      maxPoolForward<2, kChannelsLast><<<blocks, kThreads, 0, backend_.stream()>>>(x, y, argmax, geometry_, outputs);
    else if (geometry_.kernel == 3)
      maxPoolForward<3, kChannelsLast><<<blocks, kThreads, 0, backend_.stream()>>>(x, y, argmax, geometry_, outputs);
    else
      maxPoolForward<0, kChannelsLast><<<blocks, kThreads, 0, backend_.stream()>>>(x, y, argmax, geometry_, outputs);
    checkLaunch("maxPool2d forward");
  }

  CudaBackend& backend_;
  bool channelsLast_;  // the backend's activation layout when the op was made
  PoolGeometry geometry_{};
  int64_t inputs_ = 0, outputs_ = 0;
  std::shared_ptr<void> argmax_;  // per output: where in its input plane the maximum was
};

}  // namespace

std::unique_ptr<MaxPool2dOp> CudaBackend::maxPool2d(const Pool2dSpec& spec) { return std::make_unique<CudaMaxPool2d>(*this, spec); }

}  // namespace accordion::cuda
