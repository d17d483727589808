// Every op of the engine, for one device: the CPU (ops/cpu_backend.h, oneDNN, OpenBLAS and OpenMP
// loops) or a CUDA GPU (cuda/ops/, own kernels with cuDNN and cuBLAS). A model is built over one
// Backend and never asks which device it runs on. The ops are listed once, with what each
// computes, in ops/device_ops.def; each has one signature, with its CPU implementation in
// cpp/ops/<op>.cpp and its CUDA twin in cuda/ops/<op>.cu, and the kernel lab (cuda/lab/) checks
// the twins against each other.
//
// A Backend serves one model: on a GPU it owns that model's stream, library handles and memory pool.
// Work is enqueued in call order and may run asynchronously: read results on the host only after
// download() and synchronize(). All pointers are on the backend's device unless named host.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ops/compression_kernels.h"
#include "core/precision.h"
#include "core/tensor.h"
#include "ops/batchnorm2d.h"
#include "ops/conv2d.h"
#include "ops/maxpool2d.h"

namespace accordion {

// A read-only run of floats.
struct ConstSpan {
  const float* data;
  int64_t size;
};

// One parameter of an SGD update.
struct SgdSlot {
  float* value;
  const float* grad;
  float* momentum;  // PyTorch's momentum buffer
  int64_t size;
};

struct SgdHyper {
  float learningRate, momentum, weightDecay;
  bool nesterov;
};

// Choices a backend applies to every op it prepares; set before the first op is made.
struct BackendOptions {
  // GPU convolutions: false, the FMA algorithm cuDNN times fastest for each shape, transforms
  // included (as PyTorch's cudnn.benchmark); true, only those without a transform (FFT, non-fused
  // Winograd), whose weight gradients stay within 1e-4 of float64 where a transform's came 2e-3
  // away. The CPU has one kind.
  bool accurateConvolutions = false;
  // GPU convolutions and gemm() in fp32 on TF32 tensor cores (inputs rounded to 10 mantissa bits,
  // sums in fp32), as PyTorch's allow_tf32; false: FMA math only. The compressors' products stay
  // fp32 either way. The CPU has no TF32 (the binding refuses it there).
  bool tf32 = false;
  // The precision of convolutions and matrix products: Fp32, or Bf16 (autocast's semantics: their
  // inputs and weights rounded to bf16, products accumulated and written in fp32; everything else,
  // parameters and gradients included, stays fp32).
  Precision compute = Precision::Fp32;
  // GPU activations channels-last (NHWC) or channels-first (NCHW); unset, the backend's choice
  // (CudaBackend::channelsLast: NHWC in bf16, the layout of cuDNN's tensor-core kernels, NCHW in
  // fp32). The CPU's activations are always channels-last.
  std::optional<bool> channelsLast;
};

class Backend : public Allocator {
 public:
  BackendOptions options;

  // ---- Memory and order -------------------------------------------------------------------
  // Activations (N, C, H, W) are stored channels-last (NHWC) or channels-first (NCHW).
  virtual bool channelsLast() const = 0;
  // Waits until everything enqueued so far has finished.
  virtual void synchronize() = 0;
  // Bytes held by this backend's tensors now (device memory, or on the CPU host memory), and at
  // most since the backend began or resetPeakMemory() (which restarts the peak at the bytes held
  // now, as torch.cuda.reset_peak_memory_stats does).
  struct MemoryStats {
    int64_t allocated = 0, peak = 0;
  };
  virtual MemoryStats memoryStats() const = 0;
  virtual void resetPeakMemory() = 0;
  // In bf16 compute, autocast's cast cache: between beginCastScope() and endCastScope() (a step's
  // forward and backward, over which the parameters do not change) a product may keep the bf16 copy
  // of an operand that is one of `parameters` and use it again, instead of rounding it for every
  // call (the LSTM multiplies by its recurrent weights once per time step). Outside a scope nothing
  // is kept. Devices that do not compute in bf16 ignore both.
  virtual void setParameters(std::vector<ConstSpan> parameters) { (void)parameters; }
  virtual void beginCastScope() {}
  virtual void endCastScope() {}

  // ---- The ops of ops/device_ops.def, one override each per device --------------------------
#define ACCORDION_OP(Result, name, parameters) virtual Result name parameters = 0;
#include "ops/device_ops.def"
#undef ACCORDION_OP

  // ---- Composites of those ops, the same on every device --------------------------------------
  void addInPlace(float* a, const float* b, int64_t n) { add(a, b, a, n); }  // a += b
  // Linear: y (rows, out) = x (rows, in)·Wᵀ + b, W (out, in), from gemm and the bias rows
  // (ops/linear.cpp).
  void linearForward(const float* x, const float* weight, const float* bias, float* y, int64_t rows, int64_t in, int64_t out);
  // dW = dyᵀ·x, db = Σ_rows dy, dx = dy·W.
  void linearBackward(const float* x, const float* weight, const float* dy, float* dx, float* dWeight, float* dBias, int64_t rows,
                      int64_t in, int64_t out);

  // ---- Gradient compression ------------------------------------------------------------------
  virtual CompressionKernels& compression() = 0;

  // ---- Tensors (built on the calls above) ----------------------------------------------------
  Tensor empty(Shape shape) { return Tensor(std::move(shape), *this); }
  Tensor zeros(Shape shape) {
    Tensor t(std::move(shape), *this);
    fill(t.data(), t.numel(), 0.0f);
    return t;
  }
  // A copy of a host tensor on this device (the same tensor when this device is the host).
  Tensor toDevice(const Tensor& host) {
    if (host.device() == device()) return host;
    Tensor t(host.shape(), *this);
    upload(t.data(), host.data(), host.bytes());
    return t;
  }
  // A host copy of a tensor on this device; waits for the device.
  Tensor toHost(const Tensor& t) {
    Tensor host(t.shape());
    download(host.data(), t.data(), t.bytes());
    synchronize();
    return host;
  }
};

// The backend of `device`: the CPU's, or a GPU's (cuda::makeBackend).
std::unique_ptr<Backend> makeBackend(const Device& device, const BackendOptions& options = {});

namespace cuda {
// The ops of GPU `device` for one model: its own stream, cuDNN and cuBLAS handles and memory pool
// (cuda/ops/cuda_backend.cu; ops/cuda_backend_absent.cpp in builds without CUDA). Throws EngineError
// naming the cause when the device or the libraries are not usable: ERR_NO_CUDA (not built),
// ERR_NO_CUDA_DEVICE (no driver or no such device), ERR_CUDA_LIBRARY (cuDNN or cuBLAS not found,
// with the paths tried). cuda::unusable (core/cuda.h) says so beforehand, cheaply.
std::unique_ptr<Backend> makeBackend(int device);
}  // namespace cuda

}  // namespace accordion
