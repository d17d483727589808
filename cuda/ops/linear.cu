// Linear on cuBLAS (fp32 GEMMs, no TF32), its bias through bias.cu: y = x·Wᵀ + b, dW = dyᵀ·x,
// dx = dy·W, db = Σ_rows dy, with x (rows, in), W (out, in), y and dy (rows, out), all row-major.
//
// cuBLAS is column-major, and a row-major (r, c) buffer with leading dimension c is, to cuBLAS, its
// transpose: a column-major (c, r) matrix with the same leading dimension. So each row-major product
// C = A·B is asked as Cᵀ = Bᵀ·Aᵀ, whose column-major result is C's row-major buffer; an operand is
// op N where the product needs its transpose (what cuBLAS sees) and op T where it needs the matrix:
//   y  = x·Wᵀ  as yᵀ (out, rows) = W·xᵀ:   sgemm(T, N, out, rows, in,  W ld in, x ld in,   y ld out)
//   dW = dyᵀ·x as dWᵀ (in, out)  = xᵀ·dy:  sgemm(N, T, in, out, rows,  x ld in, dy ld out, dW ld in)
//   dx = dy·W  as dxᵀ (in, rows) = Wᵀ·dyᵀ: sgemm(N, N, in, rows, out,  W ld in, dy ld out, dx ld in)
#include "core/check.h"
#include "ops/cuda_backend.h"

namespace accordion::cuda {

void CudaBackend::linearForward(const float* x, const float* weight, const float* bias, float* y, int64_t rows, int64_t in,
                                int64_t out) {
  const int m = cublas::dimension(out, "linear", "outputs"), n = cublas::dimension(rows, "linear", "rows"),
            k = cublas::dimension(in, "linear", "inputs");
  broadcastRows(bias, y, rows, out);
  const float one = 1;
  // yᵀ (out, rows) = W·xᵀ + yᵀ
  cublas::check(cublas::api().sgemm(cublas(), cublas::kTranspose, cublas::kNoTranspose, m, n, k, &one, weight, k, x, k, &one, y, m),
                "cublasSgemm (linear forward)");
}

void CudaBackend::linearBackward(const float* x, const float* weight, const float* dy, float* dx, float* dWeight, float* dBias,
                                 int64_t rows, int64_t in, int64_t out) {
  const int r = cublas::dimension(rows, "linear", "rows"), i = cublas::dimension(in, "linear", "inputs"),
            o = cublas::dimension(out, "linear", "outputs");
  const cublas::Api& blas = cublas::api();
  const float one = 1, zero = 0;
  // dWᵀ (in, out) = xᵀ·dy
  cublas::check(blas.sgemm(cublas(), cublas::kNoTranspose, cublas::kTranspose, i, o, r, &one, x, i, dy, o, &zero, dWeight, i),
                "cublasSgemm (linear weight gradient)");
  // dxᵀ (in, rows) = Wᵀ·dyᵀ
  cublas::check(blas.sgemm(cublas(), cublas::kNoTranspose, cublas::kNoTranspose, i, r, o, &one, weight, i, dy, o, &zero, dx, i),
                "cublasSgemm (linear input gradient)");
  columnSums(dy, dBias, rows, out);
}

}  // namespace accordion::cuda
