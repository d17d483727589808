// (N, C, H, W) → (N, C·H·W) in PyTorch's channel-major order, and back: on NCHW activations that is
// the memory order, so both directions are device copies; on NHWC ones each image is transposed,
// (H·W, C) → (C, H·W), and back.
#include "ops/transpose.cuh"

namespace accordion::cuda {

void CudaBackend::flattenForward(const float* x, float* y, int64_t n, int64_t c, int64_t h, int64_t w) {
  if (channelsLast())
    transposeBatched(*this, x, Element::Fp32, y, Element::Fp32, n, h * w, c);
  else
    copy(y, x, static_cast<size_t>(n * c * h * w) * sizeof(float));
}

void CudaBackend::flattenBackward(const float* dy, float* dx, int64_t n, int64_t c, int64_t h, int64_t w) {
  if (channelsLast())
    transposeBatched(*this, dy, Element::Fp32, dx, Element::Fp32, n, c, h * w);
  else
    copy(dx, dy, static_cast<size_t>(n * c * h * w) * sizeof(float));
}

}  // namespace accordion::cuda
