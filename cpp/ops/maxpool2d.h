// Max pooling over square windows, as torch.nn.MaxPool2d (padding counts as −∞).
#pragma once
#include "core/tensor.h"

namespace accordion {

struct Pool2dSpec {
  int64_t batch = 0, channels = 0, height = 0, width = 0;
  int64_t kernel = 2, stride = 2, padding = 0;
  int64_t outHeight() const { return (height + 2 * padding - kernel) / stride + 1; }
  int64_t outWidth() const { return (width + 2 * padding - kernel) / stride + 1; }
  Shape inputShape() const { return {batch, channels, height, width}; }
  Shape outputShape() const { return {batch, channels, outHeight(), outWidth()}; }
};

class MaxPool2dOp {
 public:
  virtual ~MaxPool2dOp() = default;
  // Remembers where each maximum came from (the first in the window, row by row, among equals).
  virtual void forward(const float* x, float* y) = 0;
  // dx: each dy goes to the position its maximum came from in the last forward; the rest is 0.
  virtual void backward(const float* dy, float* dx) = 0;
};

}  // namespace accordion
