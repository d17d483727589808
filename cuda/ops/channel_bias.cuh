// A convolution's bias on the GPU: y += bias[c] per channel of its output, and the bias's gradient,
// each channel's Σ dy summed in a fixed order (the same bits on every run), on NCHW or NHWC
// activations.
#pragma once
#include <cstdint>
#include <memory>

#include "ops/cuda_backend.h"

namespace accordion::cuda {

class ChannelBias {
 public:
  // Outputs of `images` × `channels` × `plane` floats: NCHW (N, C, OH·OW), or NHWC seen as
  // (N·OH·OW, C, 1).
  ChannelBias(CudaBackend& backend, int64_t images, int channels, int plane);
  void add(float* y, const float* bias);
  void gradient(const float* dy, float* dBias);

 private:
  dim3 grid() const;

  CudaBackend& backend_;
  // The kernels' grid: slices_ blocks over each channel's perChannel_ = images·plane elements.
  int channels_ = 0, plane_ = 0, slices_ = 0;
  int64_t perChannel_ = 0, perBlock_ = 0;
  std::shared_ptr<void> partials_;  // (channels, slices_) doubles, when slices_ > 1
};

}  // namespace accordion::cuda
