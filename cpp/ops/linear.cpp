// Linear, composed of the backend's own products: y = x·Wᵀ + b, dW = dyᵀ·x, dx = dy·W,
// db = Σ_rows dy, with x (rows, in), W (out, in), y and dy (rows, out), all row-major.
#include "ops/backend.h"

namespace accordion {

void Backend::linearForward(const float* x, const float* weight, const float* bias, float* y, int64_t rows, int64_t in, int64_t out) {
  broadcastRows(bias, y, rows, out);
  gemm(false, true, rows, out, in, x, weight, y, true);
}

void Backend::linearBackward(const float* x, const float* weight, const float* dy, float* dx, float* dWeight, float* dBias,
                             int64_t rows, int64_t in, int64_t out) {
  gemm(true, false, out, in, rows, dy, x, dWeight, false);
  gemm(false, false, rows, in, out, dy, weight, dx, false);
  columnSums(dy, dBias, rows, out);
}

}  // namespace accordion
