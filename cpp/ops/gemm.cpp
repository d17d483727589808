// General row-major GEMM on OpenBLAS: C (m, n) = op(A)·op(B) (+ C).
#include <cblas.h>

#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
                      bool accumulate) {
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a, transA ? m : k, b,
              transB ? k : n, accumulate ? 1.0f : 0.0f, c, n);
}

}  // namespace accordion
