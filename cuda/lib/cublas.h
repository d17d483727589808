// The part of cuBLAS's API the engine uses (single-precision GEMMs, single and batched), declared here with the ABI of
// cuBLAS 11 to 13 (cublas_api.h) and bound with dlopen at first use: no cuBLAS headers at build time.
#pragma once
#include <cuda_runtime.h>

#include "core/cuda.h"

struct cublasContext;  // cuBLAS's opaque handle type, declared at global scope as in cublas_api.h

namespace accordion::cuda::cublas {

using Handle = struct cublasContext*;
using Status = int;  // cublasStatus_t

constexpr Status kSuccess = 0;  // CUBLAS_STATUS_SUCCESS
constexpr int kNoTranspose = 0, kTranspose = 1;  // CUBLAS_OP_N, CUBLAS_OP_T
constexpr int kDefaultMath = 0;  // CUBLAS_DEFAULT_MATH: fp32 GEMMs in fp32, no TF32 tensor cores
constexpr int kTf32Math = 3;     // CUBLAS_TF32_TENSOR_OP_MATH: fp32 GEMMs on TF32 tensor cores
constexpr int kFloat32 = 0;      // CUDA_R_32F (cudaDataType_t)
constexpr int kBfloat16 = 14;    // CUDA_R_16BF
constexpr int kCompute32F = 68;  // CUBLAS_COMPUTE_32F: sums in fp32
constexpr int kGemmDefault = -1; // CUBLAS_GEMM_DEFAULT

// Column-major, as BLAS: C (m, n) = α·op(A)·op(B) + β·C.
struct Api {
  Status (*create)(Handle*);
  Status (*destroy)(Handle);
  Status (*setStream)(Handle, cudaStream_t);
  Status (*setMathMode)(Handle, int mode);
  Status (*getProperty)(int type, int* value);  // type: 0 major, 1 minor, 2 patch
  const char* (*getStatusString)(Status);
  Status (*sgemm)(Handle, int transa, int transb, int m, int n, int k, const float* alpha, const float* a, int lda, const float* b,
                  int ldb, const float* beta, float* c, int ldc);
  Status (*sgemmStridedBatched)(Handle, int transa, int transb, int m, int n, int k, const float* alpha, const float* a, int lda,
                                long long strideA, const float* b, int ldb, long long strideB, const float* beta, float* c, int ldc,
                                long long strideC, int batchCount);
  // One GEMM per entry of the device arrays of pointers, all of one shape.
  Status (*sgemmBatched)(Handle, int transa, int transb, int m, int n, int k, const float* alpha, const float* const a[], int lda,
                         const float* const b[], int ldb, const float* beta, float* const c[], int ldc, int batchCount);
  // A GEMM whose operands and result each have a data type (bf16 operands, an fp32 result).
  Status (*gemmEx)(Handle, int transa, int transb, int m, int n, int k, const void* alpha, const void* a, int aType, int lda,
                   const void* b, int bType, int ldb, const void* beta, void* c, int cType, int ldc, int computeType, int algo);
};

// The loaded API; throws EngineError ERR_CUDA_LIBRARY, naming every path tried, when cuBLAS is missing.
const Api& api();
LibraryStatus status();
// Throws EngineError ERR_CUBLAS naming the call when `s` is not success.
void check(Status s, const char* what);
// cuBLAS takes int dimensions: `size` as one, or ERR_INVALID_ARGUMENT naming the op and the
// dimension when it is negative or above INT_MAX.
int dimension(int64_t size, const char* op, const char* name);

}  // namespace accordion::cuda::cublas
