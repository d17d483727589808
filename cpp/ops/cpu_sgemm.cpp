#include "ops/cpu_sgemm.h"

#include <cblas.h>

#include <cstring>
#include <string>

#include <oneapi/dnnl/dnnl.h>

#include "core/errors.h"
#include "ops/cpu_bf16.h"

namespace accordion {

SgemmLibrary cpuSgemmLibrary() {
  // "Prescott" is the generic x86-64 core OpenBLAS falls back to on a CPU it does not know.
  static const bool openBlasGeneric = std::strcmp(openblas_get_corename(), "Prescott") == 0;
  static const bool oneDnnVectors = std::strcmp(cpuIsaName(), "sse4.1 or older") != 0;
  static const SgemmLibrary library = openBlasGeneric && oneDnnVectors ? SgemmLibrary::OneDnn : SgemmLibrary::OpenBlas;
  return library;
}

const char* sgemmLibraryName(SgemmLibrary library) { return library == SgemmLibrary::OneDnn ? "onednn" : "openblas"; }

void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c) {
  if (cpuSgemmLibrary() == SgemmLibrary::OneDnn) {
    const dnnl_status_t status = dnnl_sgemm(transA ? 'T' : 'N', transB ? 'T' : 'N', m, n, k, 1.0f, a, lda, b, ldb, beta, c, n);
    if (status != dnnl_success)
      throw invalidArgument("oneDNN's sgemm refused a " + std::to_string(m) + " x " + std::to_string(k) + " x " + std::to_string(n) +
                            " product (status " + std::to_string(status) + ")");
    return;
  }
  cblas_sgemm(CblasRowMajor, transA ? CblasTrans : CblasNoTrans, transB ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), 1.0f, a, static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(n));
}

}  // namespace accordion
