// The CUDA implementation of every op (ops/backend.h): cuDNN for convolutions and cuBLAS for the
// linear layers (both loaded at run time, TF32 off), own kernels for the rest, one file per op in
// cuda/ops/. Activations are channels-first (NCHW), the layout of cuDNN's fastest fp32 kernels, or
// in bf16 compute channels-last (NHWC), the layout its tensor-core kernels read without transposing
// (BackendOptions::channelsLast overrides the choice).
//
// One backend serves one model: all its work is enqueued, in call order, on the backend's stream;
// memory comes from the device's stream-ordered pool, so allocating and freeing never waits for the
// device. The only waits are synchronize() and what reads results on the host.
#pragma once
#include <cuda_runtime.h>

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "ops/cuda_compression_kernels.h"
#include "lib/cublas.h"
#include "lib/cudnn.h"
#include "ops/backend.h"
#include "ops/cast_cache.h"

namespace accordion::cuda {

// A backend's stream and memory accounting, shared with every allocation it hands out, so memory is
// returned in stream order even after the backend itself is gone.
struct StreamContext {
  int device = 0;
  cudaStream_t stream = nullptr;
  std::atomic<int64_t> allocated{0}, peak{0};
  ~StreamContext();
  void count(int64_t bytes);
};

// What a GPU convolution chose for its shape, per direction: e.g. "forward IMPLICIT_PRECOMP_GEMM
// (FMA, 0.412 ms, 0 B scratch); backward-data ALGO_1 (…); backward-filter ALGO_1 (…)". A Conv2dOp
// of this backend is one (dynamic_cast); the kernel lab logs it with each convolution's rows.
class ConvolutionChoice {
 public:
  virtual ~ConvolutionChoice() = default;
  virtual const std::string& algorithms() const = 0;
};

class CudaBackend : public Backend {
 public:
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  Device device() const override { return Device::cuda(context_->device); }
  std::shared_ptr<void> allocate(size_t bytes) override;
  bool channelsLast() const override { return options.channelsLast.value_or(options.compute == Precision::Bf16); }
  void synchronize() override;
  MemoryStats memoryStats() const override { return {context_->allocated.load(), context_->peak.load()}; }
  void resetPeakMemory() override { context_->peak.store(context_->allocated.load()); }
  // bf16 compute's cast cache (Backend::beginCastScope): a parameter's bf16 copy, rounded at its
  // first use in a scope and used again by the scope's later products (ops/bf16.cu).
  void setParameters(std::vector<ConstSpan> parameters) override { casts_.setParameters(parameters); }
  void beginCastScope() override { casts_.begin(); }
  void endCastScope() override { casts_.end(); }
  // x (n values) in bf16 (ops/bf16.cuh): the scope's kept copy where x is a parameter, else a fresh
  // copy, held by `fresh` until the caller's work is enqueued.
  const void* bf16Operand(const float* x, int64_t n, std::shared_ptr<void>& fresh);

#define ACCORDION_OP(Result, name, parameters) Result name parameters override;
#include "ops/device_ops.def"
#undef ACCORDION_OP

  CompressionKernels& compression() override;

  // ---- For the ops' implementations ----------------------------------------------------------
  cudaStream_t stream() const { return context_->stream; }
  cudnn::Handle cudnn() const { return cudnn_; }
  // The cuBLAS handle with its math mode set to TF32 tensor cores or to fp32 (the handle keeps
  // the mode: set only when it changes).
  cublas::Handle cublas(bool tf32);
  // Scratch memory of `bytes` for one call (cuDNN's workspaces, partial sums): the caller holds it
  // while it queues its work; dropped, it goes back to the pool in stream order, after that work,
  // so a workspace counts in the peak only while a call uses it (none for 0 bytes).
  std::shared_ptr<void> scratch(size_t bytes) { return bytes ? allocate(bytes) : nullptr; }
  // `bytes` of host data (a table of pointers and sizes for a kernel over a list of tensors) on the
  // device. Tables are cached by content: the per-step lists of a model upload once.
  const void* deviceTable(const void* host, size_t bytes);
  // Device memory that lives until the next call for the same `slot` (small per-op scratch).
  template <typename T>
  T* scratch(std::shared_ptr<void>& slot, size_t& capacity, int64_t count) {
    const size_t bytes = static_cast<size_t>(count) * sizeof(T);
    if (capacity < bytes) {
      slot = allocate(bytes);
      capacity = bytes;
    }
    return static_cast<T*>(slot.get());
  }

 private:
  // Destroys the library handles and the copy stream that exist (constructor failures and the destructor).
  void releaseHandles();
  // Keeps host memory that the device is still copying from until the copy has finished.
  void holdUntilDone(cudaStream_t stream, std::shared_ptr<const void> owner);
  void releaseFinished();

  std::shared_ptr<StreamContext> context_;
  cudaStream_t copyStream_ = nullptr;  // uploads ahead of the compute on context_->stream
  cudnn::Handle cudnn_ = nullptr;
  cublas::Handle cublas_ = nullptr;
  int cublasMath_ = cublas::kDefaultMath;  // the handle's math mode
  CastCache<std::shared_ptr<void>> casts_;  // each parameter's bf16 copy in device memory
  struct Table {
    std::string content;
    std::shared_ptr<void> memory;
  };
  std::deque<Table> tables_;  // most recently used first
  std::shared_ptr<void> embeddingGroups_;  // embeddingBackward's positions grouped by token
  size_t embeddingGroupsBytes_ = 0;
  struct InFlight {
    cudaEvent_t done;
    std::shared_ptr<const void> owner;
  };
  std::deque<InFlight> inFlight_;
  std::unique_ptr<CudaCompressionKernels> compression_;
};

}  // namespace accordion::cuda
