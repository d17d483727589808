// The part of cuDNN's API the engine uses (convolutions), declared here with the ABI of cuDNN 8 and 9
// (cudnn_graph.h / cudnn_cnn.h) and bound with dlopen at first use: no cuDNN headers at build time.
// The GPU check (scripts/gpu-check/) compiles cuda/lab/abi_check.cu against the real headers where
// they exist, to check these declarations.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "core/cuda.h"

// cuDNN's own opaque types, declared at global scope as in cudnn.h, so the handles are the same types.
struct cudnnContext;
struct cudnnTensorStruct;
struct cudnnFilterStruct;
struct cudnnConvolutionStruct;

namespace accordion::cuda::cudnn {

using Handle = struct cudnnContext*;
using TensorDescriptor = struct cudnnTensorStruct*;
using FilterDescriptor = struct cudnnFilterStruct*;
using ConvolutionDescriptor = struct cudnnConvolutionStruct*;
using Status = int;  // cudnnStatus_t

constexpr Status kSuccess = 0;        // CUDNN_STATUS_SUCCESS
constexpr int kFloat = 0;             // CUDNN_DATA_FLOAT
constexpr int kBfloat16 = 9;          // CUDNN_DATA_BFLOAT16
constexpr int kNchw = 0;              // CUDNN_TENSOR_NCHW
constexpr int kNhwc = 1;              // CUDNN_TENSOR_NHWC
constexpr int kCrossCorrelation = 1;  // CUDNN_CROSS_CORRELATION (what deep learning calls convolution)
constexpr int kDefaultMath = 0;       // CUDNN_DEFAULT_MATH: fp32 on TF32 tensor cores where the device has them
constexpr int kTensorOpMath = 1;      // CUDNN_TENSOR_OP_MATH: bf16 (and fp16) on the tensor cores, summed in fp32
constexpr int kFmaMath = 3;           // CUDNN_FMA_MATH: plain fp32 arithmetic, no TF32 tensor cores
constexpr int kAlgorithmCount = 8;    // at least CUDNN_CONVOLUTION_FWD_ALGO_COUNT and the backward counts

// The names of the algorithms by number (cudnnConvolutionFwdAlgo_t, …BwdDataAlgo_t, …BwdFilterAlgo_t)
// and of the math types (cudnnMathType_t), for logs.
constexpr const char* kForwardAlgorithms[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM",     "DIRECT",
                                              "FFT",           "FFT_TILING",            "WINOGRAD", "WINOGRAD_NONFUSED"};
constexpr const char* kBackwardDataAlgorithms[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
constexpr const char* kBackwardFilterAlgorithms[] = {"ALGO_0", "ALGO_1", "FFT", "ALGO_3", "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};
constexpr const char* kMathTypes[] = {"DEFAULT", "TENSOR_OP", "TENSOR_OP_ALLOW_CONVERSION", "FMA"};

// cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t share this layout.
struct AlgoPerf {
  int algo;
  Status status;
  float time;  // milliseconds
  size_t memory;
  int determinism;
  int mathType;
  int reserved[3];
};

struct Api {
  size_t (*getVersion)();
  const char* (*getErrorString)(Status);
  Status (*create)(Handle*);
  Status (*destroy)(Handle);
  Status (*setStream)(Handle, cudaStream_t);
  Status (*createTensorDescriptor)(TensorDescriptor*);
  Status (*destroyTensorDescriptor)(TensorDescriptor);
  Status (*setTensor4dDescriptor)(TensorDescriptor, int format, int dataType, int n, int c, int h, int w);
  Status (*createFilterDescriptor)(FilterDescriptor*);
  Status (*destroyFilterDescriptor)(FilterDescriptor);
  Status (*setFilter4dDescriptor)(FilterDescriptor, int dataType, int format, int k, int c, int h, int w);
  Status (*createConvolutionDescriptor)(ConvolutionDescriptor*);
  Status (*destroyConvolutionDescriptor)(ConvolutionDescriptor);
  Status (*setConvolution2dDescriptor)(ConvolutionDescriptor, int padH, int padW, int strideH, int strideW, int dilationH,
                                       int dilationW, int mode, int computeType);
  Status (*setConvolutionMathType)(ConvolutionDescriptor, int mathType);
  // Times the algorithms on scratch memory of cuDNN's own and returns them fastest first.
  Status (*findConvolutionForwardAlgorithm)(Handle, TensorDescriptor x, FilterDescriptor w, ConvolutionDescriptor,
                                            TensorDescriptor y, int requested, int* returned, AlgoPerf* results);
  Status (*findConvolutionBackwardDataAlgorithm)(Handle, FilterDescriptor w, TensorDescriptor dy, ConvolutionDescriptor,
                                                 TensorDescriptor dx, int requested, int* returned, AlgoPerf* results);
  Status (*findConvolutionBackwardFilterAlgorithm)(Handle, TensorDescriptor x, TensorDescriptor dy, ConvolutionDescriptor,
                                                   FilterDescriptor dw, int requested, int* returned, AlgoPerf* results);
  Status (*convolutionForward)(Handle, const void* alpha, TensorDescriptor, const void* x, FilterDescriptor, const void* w,
                               ConvolutionDescriptor, int algo, void* workspace, size_t workspaceBytes, const void* beta,
                               TensorDescriptor, void* y);
  Status (*convolutionBackwardData)(Handle, const void* alpha, FilterDescriptor, const void* w, TensorDescriptor, const void* dy,
                                    ConvolutionDescriptor, int algo, void* workspace, size_t workspaceBytes, const void* beta,
                                    TensorDescriptor, void* dx);
  Status (*convolutionBackwardFilter)(Handle, const void* alpha, TensorDescriptor, const void* x, TensorDescriptor, const void* dy,
                                      ConvolutionDescriptor, int algo, void* workspace, size_t workspaceBytes, const void* beta,
                                      FilterDescriptor, void* dw);
};

// The loaded API; throws EngineError ERR_CUDA_LIBRARY, naming every path tried, when cuDNN is missing.
const Api& api();
LibraryStatus status();
// Throws EngineError ERR_CUDNN naming the call when `s` is not success.
void check(Status s, const char* what);

}  // namespace accordion::cuda::cudnn
