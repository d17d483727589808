// Checks that lib/cudnn.h, lib/cublas.h and lib/nccl.h, which declare the part of cuDNN, cuBLAS and
// NCCL the engine binds with dlopen, match NVIDIA's own headers: every constant, the layout of the
// algorithm performance records and of NCCL's config, and the signature of every function pointer. All checks are static_asserts,
// so a mismatch fails the build and naming it; the program only reports the versions it checked.
// Compiled only where the headers are (the GPU check, scripts/gpu-check/), e.g. from pip's wheels, with
// -I<site-packages>/nvidia/{cudnn,cublas,nccl}/include:
//   nvcc -std=c++17 -Icpp -Icuda -I<cudnn include> -I<cublas include> -I<nccl include> cuda/lab/abi_check.cu -o abi_check
//
// NVIDIA's headers come first on purpose: our handle types are written `struct cudnnContext*` etc.,
// and such a name refers to NVIDIA's global struct only when that is already declared; otherwise it
// declares a struct of the same name in our namespace (the same ABI, a pointer, but a distinct type
// that would make every signature below compare unequal).
#include <cublas_v2.h>
#include <cudnn.h>
#include <nccl.h>

#include <cstddef>
#include <cstdio>
#include <iterator>
#include <type_traits>

#include "lib/cublas.h"
#include "lib/cudnn.h"
#include "lib/nccl.h"

namespace {

namespace dnn = accordion::cuda::cudnn;
namespace blas = accordion::cuda::cublas;
namespace coll = accordion::cuda::nccl;

// A vendor type as our headers declare it. Enums become int: C enums here are int-sized (asserted),
// and the x86-64 and AArch64 calling conventions pass and return them exactly as int. The algorithm
// performance records become our one AlgoPerf, whose layout is checked field by field below.
// Everything else (handles, descriptors, pointers, size_t, cudaStream_t) must be the very same type.
template <typename T, typename = void>
struct Declared {
  using type = T;
};
template <typename T>
struct Declared<T, std::enable_if_t<std::is_enum_v<T>>> {
  static_assert(sizeof(T) == sizeof(int) && alignof(T) == alignof(int), "a vendor enum is not int-sized");
  using type = int;
};
template <>
struct Declared<cudnnConvolutionFwdAlgoPerf_t*> {
  using type = dnn::AlgoPerf*;
};
template <>
struct Declared<cudnnConvolutionBwdDataAlgoPerf_t*> {
  using type = dnn::AlgoPerf*;
};
template <>
struct Declared<cudnnConvolutionBwdFilterAlgoPerf_t*> {
  using type = dnn::AlgoPerf*;
};
template <>
struct Declared<ncclUniqueId> {
  using type = coll::UniqueId;
};
template <>
struct Declared<ncclUniqueId*> {
  using type = coll::UniqueId*;
};
template <>
struct Declared<ncclConfig_t*> {
  using type = coll::Config*;
};
// ncclCommGetAsyncError's out-parameter: an int-sized enum written through a pointer.
template <>
struct Declared<ncclResult_t*> {
  static_assert(sizeof(ncclResult_t) == sizeof(int), "ncclResult_t is not int-sized");
  using type = int*;
};
// A function pointer: the return type and each parameter, in number and order. Top-level const on
// a vendor parameter (`const cudnnTensorDescriptor_t`) is not part of the function's type.
template <typename R, typename... Args>
struct Declared<R (*)(Args...)> {
  using type = typename Declared<R>::type (*)(typename Declared<Args>::type...);
};

// Our member's pointer type against the address of the symbol the loader binds it to.
template <typename Ours, typename Vendor>
constexpr bool sameSignature = std::is_same_v<typename Declared<Vendor>::type, Ours>;

// ---- cuDNN ----------------------------------------------------------------------------------

static_assert(std::is_same_v<dnn::Handle, cudnnHandle_t>, "cudnn::Handle (include NVIDIA's headers first)");
static_assert(std::is_same_v<dnn::TensorDescriptor, cudnnTensorDescriptor_t>, "cudnn::TensorDescriptor");
static_assert(std::is_same_v<dnn::FilterDescriptor, cudnnFilterDescriptor_t>, "cudnn::FilterDescriptor");
static_assert(std::is_same_v<dnn::ConvolutionDescriptor, cudnnConvolutionDescriptor_t>, "cudnn::ConvolutionDescriptor");
static_assert(sizeof(dnn::Status) == sizeof(cudnnStatus_t), "cudnn::Status");

static_assert(dnn::kSuccess == CUDNN_STATUS_SUCCESS, "cudnn::kSuccess");
static_assert(dnn::kFloat == CUDNN_DATA_FLOAT, "cudnn::kFloat");
static_assert(dnn::kBfloat16 == CUDNN_DATA_BFLOAT16, "cudnn::kBfloat16");
static_assert(dnn::kNchw == CUDNN_TENSOR_NCHW, "cudnn::kNchw");
static_assert(dnn::kNhwc == CUDNN_TENSOR_NHWC, "cudnn::kNhwc");
static_assert(dnn::kCrossCorrelation == CUDNN_CROSS_CORRELATION, "cudnn::kCrossCorrelation");
static_assert(dnn::kFmaMath == CUDNN_FMA_MATH, "cudnn::kFmaMath");
static_assert(dnn::kDefaultMath == CUDNN_DEFAULT_MATH, "cudnn::kDefaultMath");
static_assert(dnn::kTensorOpMath == CUDNN_TENSOR_OP_MATH, "cudnn::kTensorOpMath");
static_assert(dnn::kAlgorithmCount >= CUDNN_CONVOLUTION_FWD_ALGO_COUNT && dnn::kAlgorithmCount >= CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT &&
                  dnn::kAlgorithmCount >= CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
              "cudnn::kAlgorithmCount is below an algorithm count, so a find could miss the fastest");
// The names the logs give algorithms and math types, by number.
static_assert(std::size(dnn::kForwardAlgorithms) == CUDNN_CONVOLUTION_FWD_ALGO_COUNT &&
                  CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM == 0 && CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM == 1 &&
                  CUDNN_CONVOLUTION_FWD_ALGO_GEMM == 2 && CUDNN_CONVOLUTION_FWD_ALGO_DIRECT == 3 && CUDNN_CONVOLUTION_FWD_ALGO_FFT == 4 &&
                  CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING == 5 && CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD == 6 &&
                  CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED == 7,
              "cudnn::kForwardAlgorithms");
static_assert(std::size(dnn::kBackwardDataAlgorithms) == CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT &&
                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_0 == 0 && CUDNN_CONVOLUTION_BWD_DATA_ALGO_1 == 1 &&
                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT == 2 && CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING == 3 &&
                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD == 4 && CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD_NONFUSED == 5,
              "cudnn::kBackwardDataAlgorithms");
static_assert(std::size(dnn::kBackwardFilterAlgorithms) == CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT &&
                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0 == 0 && CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1 == 1 &&
                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT == 2 && CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3 == 3 &&
                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD == 4 && CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED == 5 &&
                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT_TILING == 6,
              "cudnn::kBackwardFilterAlgorithms");
static_assert(std::size(dnn::kMathTypes) == 4 && CUDNN_DEFAULT_MATH == 0 && CUDNN_TENSOR_OP_MATH == 1 &&
                  CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION == 2 && CUDNN_FMA_MATH == 3,
              "cudnn::kMathTypes");
// The version numbering that cudnn.cu decodes from cudnnGetVersion().
static_assert(CUDNN_VERSION == (CUDNN_MAJOR >= 9 ? CUDNN_MAJOR * 10000 : CUDNN_MAJOR * 1000) + CUDNN_MINOR * 100 + CUDNN_PATCHLEVEL,
              "cuDNN's version numbering changed");

template <typename Vendor>
constexpr bool sameAlgoPerf() {
  using Ours = dnn::AlgoPerf;
  return sizeof(Vendor) == sizeof(Ours) && alignof(Vendor) == alignof(Ours) &&  //
         offsetof(Vendor, algo) == offsetof(Ours, algo) && offsetof(Vendor, status) == offsetof(Ours, status) &&
         offsetof(Vendor, time) == offsetof(Ours, time) && offsetof(Vendor, memory) == offsetof(Ours, memory) &&
         offsetof(Vendor, determinism) == offsetof(Ours, determinism) && offsetof(Vendor, mathType) == offsetof(Ours, mathType) &&
         offsetof(Vendor, reserved) == offsetof(Ours, reserved) &&
         std::is_same_v<typename Declared<decltype(Vendor::algo)>::type, decltype(Ours::algo)> &&
         std::is_same_v<typename Declared<decltype(Vendor::status)>::type, decltype(Ours::status)> &&
         std::is_same_v<decltype(Vendor::time), decltype(Ours::time)> && std::is_same_v<decltype(Vendor::memory), decltype(Ours::memory)> &&
         std::is_same_v<typename Declared<decltype(Vendor::determinism)>::type, decltype(Ours::determinism)> &&
         std::is_same_v<typename Declared<decltype(Vendor::mathType)>::type, decltype(Ours::mathType)> &&
         std::is_same_v<decltype(Vendor::reserved), decltype(Ours::reserved)>;
}
static_assert(sameAlgoPerf<cudnnConvolutionFwdAlgoPerf_t>(), "cudnn::AlgoPerf against cudnnConvolutionFwdAlgoPerf_t");
static_assert(sameAlgoPerf<cudnnConvolutionBwdDataAlgoPerf_t>(), "cudnn::AlgoPerf against cudnnConvolutionBwdDataAlgoPerf_t");
static_assert(sameAlgoPerf<cudnnConvolutionBwdFilterAlgoPerf_t>(), "cudnn::AlgoPerf against cudnnConvolutionBwdFilterAlgoPerf_t");

// Each member against the symbol cudnn.cu binds it to.
static_assert(sameSignature<decltype(dnn::Api::getVersion), decltype(&cudnnGetVersion)>, "cudnnGetVersion");
static_assert(sameSignature<decltype(dnn::Api::getErrorString), decltype(&cudnnGetErrorString)>, "cudnnGetErrorString");
static_assert(sameSignature<decltype(dnn::Api::create), decltype(&cudnnCreate)>, "cudnnCreate");
static_assert(sameSignature<decltype(dnn::Api::destroy), decltype(&cudnnDestroy)>, "cudnnDestroy");
static_assert(sameSignature<decltype(dnn::Api::setStream), decltype(&cudnnSetStream)>, "cudnnSetStream");
static_assert(sameSignature<decltype(dnn::Api::createTensorDescriptor), decltype(&cudnnCreateTensorDescriptor)>,
              "cudnnCreateTensorDescriptor");
static_assert(sameSignature<decltype(dnn::Api::destroyTensorDescriptor), decltype(&cudnnDestroyTensorDescriptor)>,
              "cudnnDestroyTensorDescriptor");
static_assert(sameSignature<decltype(dnn::Api::setTensor4dDescriptor), decltype(&cudnnSetTensor4dDescriptor)>,
              "cudnnSetTensor4dDescriptor");
static_assert(sameSignature<decltype(dnn::Api::createFilterDescriptor), decltype(&cudnnCreateFilterDescriptor)>,
              "cudnnCreateFilterDescriptor");
static_assert(sameSignature<decltype(dnn::Api::destroyFilterDescriptor), decltype(&cudnnDestroyFilterDescriptor)>,
              "cudnnDestroyFilterDescriptor");
static_assert(sameSignature<decltype(dnn::Api::setFilter4dDescriptor), decltype(&cudnnSetFilter4dDescriptor)>,
              "cudnnSetFilter4dDescriptor");
static_assert(sameSignature<decltype(dnn::Api::createConvolutionDescriptor), decltype(&cudnnCreateConvolutionDescriptor)>,
              "cudnnCreateConvolutionDescriptor");
static_assert(sameSignature<decltype(dnn::Api::destroyConvolutionDescriptor), decltype(&cudnnDestroyConvolutionDescriptor)>,
              "cudnnDestroyConvolutionDescriptor");
static_assert(sameSignature<decltype(dnn::Api::setConvolution2dDescriptor), decltype(&cudnnSetConvolution2dDescriptor)>,
              "cudnnSetConvolution2dDescriptor");
static_assert(sameSignature<decltype(dnn::Api::setConvolutionMathType), decltype(&cudnnSetConvolutionMathType)>,
              "cudnnSetConvolutionMathType");
static_assert(sameSignature<decltype(dnn::Api::findConvolutionForwardAlgorithm), decltype(&cudnnFindConvolutionForwardAlgorithm)>,
              "cudnnFindConvolutionForwardAlgorithm");
static_assert(
    sameSignature<decltype(dnn::Api::findConvolutionBackwardDataAlgorithm), decltype(&cudnnFindConvolutionBackwardDataAlgorithm)>,
    "cudnnFindConvolutionBackwardDataAlgorithm");
static_assert(
    sameSignature<decltype(dnn::Api::findConvolutionBackwardFilterAlgorithm), decltype(&cudnnFindConvolutionBackwardFilterAlgorithm)>,
    "cudnnFindConvolutionBackwardFilterAlgorithm");
static_assert(sameSignature<decltype(dnn::Api::convolutionForward), decltype(&cudnnConvolutionForward)>, "cudnnConvolutionForward");
static_assert(sameSignature<decltype(dnn::Api::convolutionBackwardData), decltype(&cudnnConvolutionBackwardData)>,
              "cudnnConvolutionBackwardData");
static_assert(sameSignature<decltype(dnn::Api::convolutionBackwardFilter), decltype(&cudnnConvolutionBackwardFilter)>,
              "cudnnConvolutionBackwardFilter");
// Api holds nothing but function pointers: a member added without a check above changes its size.
static_assert(sizeof(dnn::Api) == 21 * sizeof(void (*)()), "cudnn::Api has a member that is not checked here");

// ---- cuBLAS ---------------------------------------------------------------------------------

static_assert(std::is_same_v<blas::Handle, cublasHandle_t>, "cublas::Handle (include NVIDIA's headers first)");
static_assert(sizeof(blas::Status) == sizeof(cublasStatus_t), "cublas::Status");

static_assert(blas::kSuccess == CUBLAS_STATUS_SUCCESS, "cublas::kSuccess");
static_assert(blas::kNoTranspose == CUBLAS_OP_N, "cublas::kNoTranspose");
static_assert(blas::kTranspose == CUBLAS_OP_T, "cublas::kTranspose");
static_assert(blas::kDefaultMath == CUBLAS_DEFAULT_MATH, "cublas::kDefaultMath");
static_assert(blas::kTf32Math == CUBLAS_TF32_TENSOR_OP_MATH, "cublas::kTf32Math");
static_assert(blas::kFloat32 == CUDA_R_32F && blas::kBfloat16 == CUDA_R_16BF, "cublas::kFloat32, kBfloat16");
static_assert(blas::kCompute32F == CUBLAS_COMPUTE_32F && blas::kGemmDefault == CUBLAS_GEMM_DEFAULT, "cublas::kCompute32F, kGemmDefault");
// The property numbers cublas.cu passes to cublasGetProperty.
static_assert(MAJOR_VERSION == 0 && MINOR_VERSION == 1 && PATCH_LEVEL == 2, "libraryPropertyType");

// Each member against the symbol cublas.cu binds it to: the _v2 entry points, which cublas_v2.h
// maps the plain names to.
static_assert(sameSignature<decltype(blas::Api::create), decltype(&cublasCreate_v2)>, "cublasCreate_v2");
static_assert(sameSignature<decltype(blas::Api::destroy), decltype(&cublasDestroy_v2)>, "cublasDestroy_v2");
static_assert(sameSignature<decltype(blas::Api::setStream), decltype(&cublasSetStream_v2)>, "cublasSetStream_v2");
static_assert(sameSignature<decltype(blas::Api::setMathMode), decltype(&cublasSetMathMode)>, "cublasSetMathMode");
static_assert(sameSignature<decltype(blas::Api::getProperty), decltype(&cublasGetProperty)>, "cublasGetProperty");
static_assert(sameSignature<decltype(blas::Api::getStatusString), decltype(&cublasGetStatusString)>, "cublasGetStatusString");
static_assert(sameSignature<decltype(blas::Api::sgemm), decltype(&cublasSgemm_v2)>, "cublasSgemm_v2");
static_assert(sameSignature<decltype(blas::Api::sgemmStridedBatched), decltype(&cublasSgemmStridedBatched)>, "cublasSgemmStridedBatched");
static_assert(sameSignature<decltype(blas::Api::sgemmBatched), decltype(&cublasSgemmBatched)>, "cublasSgemmBatched");
static_assert(sameSignature<decltype(blas::Api::gemmEx), decltype(&cublasGemmEx)>, "cublasGemmEx");
static_assert(sizeof(blas::Api) == 10 * sizeof(void (*)()), "cublas::Api has a member that is not checked here");

// ---- NCCL -----------------------------------------------------------------------------------

static_assert(std::is_same_v<coll::Comm, ncclComm_t>, "nccl::Comm (include NVIDIA's headers first)");
static_assert(sizeof(coll::Result) == sizeof(ncclResult_t), "nccl::Result");
static_assert(coll::kSuccess == ncclSuccess && coll::kInProgress == ncclInProgress, "nccl result codes");
static_assert(coll::kFloat32 == ncclFloat32 && coll::kSum == ncclSum, "nccl::kFloat32, nccl::kSum");
static_assert(sizeof(coll::UniqueId) == sizeof(ncclUniqueId), "nccl::UniqueId");
// Our Config is the 2.14 prefix of the header's ncclConfig_t, field for field.
static_assert(sizeof(coll::Config) <= sizeof(ncclConfig_t), "nccl::Config is larger than ncclConfig_t");
static_assert(offsetof(coll::Config, size) == offsetof(ncclConfig_t, size) && offsetof(coll::Config, magic) == offsetof(ncclConfig_t, magic) &&
                  offsetof(coll::Config, version) == offsetof(ncclConfig_t, version) &&
                  offsetof(coll::Config, blocking) == offsetof(ncclConfig_t, blocking) &&
                  offsetof(coll::Config, cgaClusterSize) == offsetof(ncclConfig_t, cgaClusterSize) &&
                  offsetof(coll::Config, minCTAs) == offsetof(ncclConfig_t, minCTAs) &&
                  offsetof(coll::Config, maxCTAs) == offsetof(ncclConfig_t, maxCTAs) &&
                  offsetof(coll::Config, netName) == offsetof(ncclConfig_t, netName),
              "nccl::Config fields");
static_assert(coll::Config{}.version == NCCL_VERSION(2, 14, 0), "nccl::Config version");
static_assert(coll::Config{}.blocking == NCCL_CONFIG_UNDEF_INT && coll::Config{}.netName == NCCL_CONFIG_UNDEF_PTR, "undefined values");

static_assert(sameSignature<decltype(coll::Api::getVersion), decltype(&ncclGetVersion)>, "ncclGetVersion");
static_assert(sameSignature<decltype(coll::Api::getErrorString), decltype(&ncclGetErrorString)>, "ncclGetErrorString");
static_assert(sameSignature<decltype(coll::Api::getUniqueId), decltype(&ncclGetUniqueId)>, "ncclGetUniqueId");
static_assert(sameSignature<decltype(coll::Api::commInitRankConfig), decltype(&ncclCommInitRankConfig)>, "ncclCommInitRankConfig");
static_assert(sameSignature<decltype(coll::Api::commFinalize), decltype(&ncclCommFinalize)>, "ncclCommFinalize");
static_assert(sameSignature<decltype(coll::Api::commDestroy), decltype(&ncclCommDestroy)>, "ncclCommDestroy");
static_assert(sameSignature<decltype(coll::Api::commAbort), decltype(&ncclCommAbort)>, "ncclCommAbort");
static_assert(sameSignature<decltype(coll::Api::commGetAsyncError), decltype(&ncclCommGetAsyncError)>, "ncclCommGetAsyncError");
static_assert(sameSignature<decltype(coll::Api::allReduce), decltype(&ncclAllReduce)>, "ncclAllReduce");
static_assert(sameSignature<decltype(coll::Api::allGather), decltype(&ncclAllGather)>, "ncclAllGather");
static_assert(sameSignature<decltype(coll::Api::broadcast), decltype(&ncclBroadcast)>, "ncclBroadcast");
static_assert(sizeof(coll::Api) == 11 * sizeof(void (*)()), "nccl::Api has a member that is not checked here");

}  // namespace

int main() {
  std::printf("cuDNN/cuBLAS/NCCL declarations match cuDNN %d.%d.%d, cuBLAS %d.%d.%d and NCCL %d.%d.%d headers\n", CUDNN_MAJOR,
              CUDNN_MINOR, CUDNN_PATCHLEVEL, CUBLAS_VER_MAJOR, CUBLAS_VER_MINOR, CUBLAS_VER_PATCH, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH);
  return 0;
}
