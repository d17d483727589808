// General row-major GEMM on cuBLAS (fp32; on TF32 tensor cores with options.tf32): C (m, n) = op(A)·op(B) (+ C).
//
// cuBLAS is column-major, and a row-major (r, c) buffer with leading dimension c is, to cuBLAS, its
// transpose: a column-major (c, r) matrix with the same leading dimension. So C = op(A)·op(B) is
// asked as Cᵀ (n, m) = op(B)ᵀ·op(A)ᵀ, whose column-major result is C's row-major buffer: B first, op N when B is stored (k, n) (ld n), op T when
// stored (n, k) (ld k); then A, op N when stored (m, k) (ld k), op T when stored (k, m) (ld m).
#include "core/check.h"
#include "ops/cuda_backend.h"

namespace accordion::cuda {

void CudaBackend::gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
                       bool accumulate) {
  const int rows = cublas::dimension(m, "gemm", "m"), cols = cublas::dimension(n, "gemm", "n"),
            depth = cublas::dimension(k, "gemm", "k");
  if (rows == 0 || cols == 0) return;
  if (depth == 0) {  // an empty sum: C is zero, or unchanged when accumulating
    if (!accumulate) fill(c, m * n, 0.0f);
    return;
  }
  const float one = 1, beta = accumulate ? 1.0f : 0.0f;
  cublas::check(cublas::api().sgemm(cublas(options.tf32), transB ? cublas::kTranspose : cublas::kNoTranspose,
                                    transA ? cublas::kTranspose : cublas::kNoTranspose, cols, rows, depth, &one, b,
                                    transB ? depth : cols, a, transA ? rows : depth, &beta, c, cols),
                "cublasSgemm (gemm)");
}

}  // namespace accordion::cuda
