// 2-D convolution (square kernel, symmetric padding, no dilation or groups), as torch.nn.Conv2d.
#pragma once
#include "core/tensor.h"

namespace accordion {

struct Conv2dSpec {
  int64_t batch = 0, inChannels = 0, height = 0, width = 0;  // input (N, C_in, H, W)
  int64_t outChannels = 0, kernel = 1, stride = 1, padding = 0;
  bool bias = false;

  int64_t outHeight() const { return (height + 2 * padding - kernel) / stride + 1; }
  int64_t outWidth() const { return (width + 2 * padding - kernel) / stride + 1; }
  Shape inputShape() const { return {batch, inChannels, height, width}; }
  Shape outputShape() const { return {batch, outChannels, outHeight(), outWidth()}; }
  Shape weightShape() const { return {outChannels, inChannels, kernel, kernel}; }
};

// One convolution of fixed shapes on one backend; whatever it prepares (algorithms, primitives,
// workspaces) is prepared once, when it is made.
class Conv2dOp {
 public:
  virtual ~Conv2dOp() = default;
  // x (N, C_in, H, W) and y (N, C_out, OH, OW) in the backend's activation layout;
  // weight (C_out, C_in, k, k); bias (C_out,) or null.
  virtual void forward(const float* x, const float* weight, const float* bias, float* y) = 0;
  // From dy and the forward's x: dWeight, dBias (when the convolution has a bias) and dx (skipped
  // when null: nobody needs the gradient of the network's input).
  virtual void backward(const float* x, const float* weight, const float* dy, float* dx, float* dWeight, float* dBias) = 0;
};

}  // namespace accordion
