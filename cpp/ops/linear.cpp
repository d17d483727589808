// Linear on OpenBLAS: y = x·Wᵀ + b, dW = dyᵀ·x, dx = dy·W, db = Σ_rows dy.
#include <cblas.h>

#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::linearForward(const float* x, const float* weight, const float* bias, float* y, int64_t rows, int64_t in,
                               int64_t out) {
  broadcastRows(bias, y, rows, out);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, out, in, 1.0f, x, in, weight, in, 1.0f, y, out);
}

void CpuBackend::linearBackward(const float* x, const float* weight, const float* dy, float* dx, float* dWeight, float* dBias,
                                int64_t rows, int64_t in, int64_t out) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, rows, 1.0f, dy, out, x, in, 0.0f, dWeight, in);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, in, out, 1.0f, dy, out, weight, in, 0.0f, dx, in);
  columnSums(dy, dBias, rows, out);
}

}  // namespace accordion
