// fp32 matrix products on the CPU (the linear layers, the LSTM, PowerSGD's factors, and bf16's
// products over rounded values): OpenBLAS's sgemm, or oneDNN's where OpenBLAS did not recognise the
// CPU and fell back to its generic Prescott (SSE3) kernels while oneDNN runs AVX2 or AVX-512 code on
// it. Debian's OpenBLAS 0.3.21 does so on Xeons newer than itself, where oneDNN's products of the
// LSTM's shapes take a fifth of the time.
#pragma once
#include <cstdint>

namespace accordion {

enum class SgemmLibrary { OpenBlas, OneDnn };

// Which library this process multiplies with (decided once, from the CPU and OpenBLAS's kernels).
SgemmLibrary cpuSgemmLibrary();
// "openblas" or "onednn".
const char* sgemmLibraryName(SgemmLibrary library);

// Row-major C (m, n) = op(A)·op(B) + beta·C, with leading dimensions lda, ldb and n.
void sgemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
           float* c);

}  // namespace accordion
