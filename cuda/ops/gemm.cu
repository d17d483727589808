// General row-major GEMM on cuBLAS (fp32; on TF32 tensor cores with options.tf32; with bf16 compute,
// A and B rounded to bf16 copies and multiplied on the tensor cores, summed and written in fp32, as
// the CPU's bf16 products): C (m, n) = op(A)·op(B) (+ C).
//
// cuBLAS is column-major, and a row-major (r, c) buffer with leading dimension c is, to cuBLAS, its
// transpose: a column-major (c, r) matrix with the same leading dimension. So C = op(A)·op(B) is
// asked as Cᵀ (n, m) = op(B)ᵀ·op(A)ᵀ, whose column-major result is C's row-major buffer: B first, op N when B is stored (k, n) (ld n), op T when
// stored (n, k) (ld k); then A, op N when stored (m, k) (ld k), op T when stored (k, m) (ld m).
#include "core/check.h"
#include "ops/bf16.cuh"
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
  const int opB = transB ? cublas::kTranspose : cublas::kNoTranspose, opA = transA ? cublas::kTranspose : cublas::kNoTranspose;
  const int ldb = transB ? depth : cols, lda = transA ? rows : depth;
  if (options.compute == Precision::Bf16) {
    std::shared_ptr<void> freshB;  // where B is not a parameter (a parameter's copy is kept for the step)
    const std::shared_ptr<void> a16 = bf16Copy(*this, a, m * k);
    const void* b16 = bf16Operand(b, k * n, freshB);
    cublas::check(cublas::api().gemmEx(cublas(false), opB, opA, cols, rows, depth, &one, b16, cublas::kBfloat16, ldb, a16.get(),
                                       cublas::kBfloat16, lda, &beta, c, cublas::kFloat32, cols, cublas::kCompute32F, cublas::kGemmDefault),
                  "cublasGemmEx (gemm, bf16)");
    return;
  }
  cublas::check(cublas::api().sgemm(cublas(options.tf32), opB, opA, cols, rows, depth, &one, b, ldb, a, lda, &beta, c, cols),
                "cublasSgemm (gemm)");
}

}  // namespace accordion::cuda
