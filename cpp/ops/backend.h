// Every op of the engine, for one device: the CPU (ops/cpu_backend.h, oneDNN, OpenBLAS and OpenMP
// loops) or a CUDA GPU (cuda/ops/, own kernels with cuDNN and cuBLAS). A model is built over one
// Backend and never asks which device it runs on; each op has one signature, with its CPU
// implementation in cpp/ops/<op>.cpp and its CUDA twin in cuda/ops/<op>.cu, and the kernel lab
// (cuda/lab/) checks the twins against each other.
//
// A Backend serves one model: on a GPU it owns that model's stream, library handles and memory pool.
// Work is enqueued in call order and may run asynchronously: read results on the host only after
// download() and synchronize(). All pointers are on the backend's device unless named host.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "ops/compression_kernels.h"
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
};

class Backend : public Allocator {
 public:
  BackendOptions options;

  // ---- Memory and order -------------------------------------------------------------------
  // Activations (N, C, H, W) are stored channels-last (NHWC) or channels-first (NCHW).
  virtual bool channelsLast() const = 0;
  // Host memory to the device, in order with the other work; the source may be reused at once.
  virtual void upload(void* dst, const void* hostSrc, size_t bytes) = 0;
  // To host memory, which holds the data once synchronize() returns.
  virtual void download(void* hostDst, const void* src, size_t bytes) = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) = 0;
  virtual void fill(float* data, int64_t n, float value) = 0;
  // Device storage holding a copy of host memory, copied so that it overlaps the work enqueued so
  // far (on a GPU: a copy engine, from pinned memory); work enqueued afterwards sees the data.
  // `hostOwner` keeps the host memory alive until the copy is done.
  virtual std::shared_ptr<void> uploadAhead(const void* hostSrc, size_t bytes, std::shared_ptr<const void> hostOwner) = 0;
  // Waits until everything enqueued so far has finished.
  virtual void synchronize() = 0;
  // Bytes of device memory held by this backend's tensors now, and at most so far.
  struct MemoryStats {
    int64_t allocated = 0, peak = 0;
  };
  virtual MemoryStats memoryStats() const = 0;

  // ---- Element-wise ops (n elements) ---------------------------------------------------------
  virtual void reluForward(const float* x, float* y, int64_t n) = 0;  // y may be x
  virtual void reluBackward(const float* y, const float* dy, float* dx, int64_t n) = 0;
  // out = a + b (out may be a or b): the residual add and its backward's fan-in.
  virtual void add(const float* a, const float* b, float* out, int64_t n) = 0;
  void addInPlace(float* a, const float* b, int64_t n) { add(a, b, a, n); }  // a += b
  virtual void scale(const float* x, float* y, int64_t n, float s) = 0;  // y = s·x
  // y = keep ? x·scale : 0, with keep drawn by the caller (so every device sees the same mask).
  virtual void dropoutForward(const float* x, const uint8_t* keep, float* y, int64_t n, float scale) = 0;
  virtual void dropoutBackward(const float* dy, const uint8_t* keep, float* dx, int64_t n, float scale) = 0;

  // ---- Activation shape ops ------------------------------------------------------------------
  // Average over H·W: (N, C, H, W) → (N, C).
  virtual void globalAvgPoolForward(const float* x, float* y, int64_t n, int64_t c, int64_t h, int64_t w) = 0;
  virtual void globalAvgPoolBackward(const float* dy, float* dx, int64_t n, int64_t c, int64_t h, int64_t w) = 0;
  // (N, C, H, W) in the activation layout → (N, C·H·W) in PyTorch's channel-major order, and back.
  virtual void flattenForward(const float* x, float* y, int64_t n, int64_t c, int64_t h, int64_t w) = 0;
  virtual void flattenBackward(const float* dy, float* dx, int64_t n, int64_t c, int64_t h, int64_t w) = 0;
  // Images given in NCHW host memory, into the activation layout on this device.
  virtual void uploadImages(const float* hostNchw, float* images, int64_t n, int64_t c, int64_t h, int64_t w) = 0;

  // ---- Linear: y (rows, out) = x (rows, in)·Wᵀ + b, W (out, in) -------------------------------
  // Composites of the products below, the same on every device (ops/linear.cpp).
  void linearForward(const float* x, const float* weight, const float* bias, float* y, int64_t rows, int64_t in, int64_t out);
  // dW = dyᵀ·x, db = Σ_rows dy, dx = dy·W.
  void linearBackward(const float* x, const float* weight, const float* dy, float* dx, float* dWeight, float* dBias, int64_t rows,
                      int64_t in, int64_t out);

  // ---- Dense products and bias rows (row-major) ----------------------------------------------
  // C (m, n) = op(A)·op(B), plus C's old value when `accumulate`; op(A) is (m, k), stored as A
  // (m, k) or, with transA, as Aᵀ (k, m); op(B) is (k, n), stored as B (k, n) or, with transB, (n, k).
  virtual void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
                    bool accumulate) = 0;
  // y[r, :] = row for each of the rows of y (rows, cols): a bias that a GEMM then accumulates onto.
  virtual void broadcastRows(const float* row, float* y, int64_t rows, int64_t cols) = 0;
  // sums[j] = Σ_r x[r, j] over x (rows, cols): a bias's gradient.
  virtual void columnSums(const float* x, float* sums, int64_t rows, int64_t cols) = 0;

  // ---- Embedding: rows of a table (entries, width) picked by token id --------------------------
  // y[r, :] = table[ids[r], :] for r < rows; ids lie in [0, entries) (the caller validates them).
  virtual void embeddingForward(const float* table, const int32_t* ids, float* y, int64_t rows, int64_t width) = 0;
  // dTable[ids[r], :] += dy[r, :], r in increasing order, so every device adds a token's rows in
  // the same order; the ids are in host memory.
  virtual void embeddingBackward(const float* dy, const int32_t* hostIds, float* dTable, int64_t rows, int64_t width) = 0;

  // ---- LSTM cell: one time step over a batch, gates (batch, 4·hidden) in the order i, f, g, o ---
  // Forward: the gates' pre-activations are replaced by their activations (σ(i), σ(f), tanh(g),
  // σ(o), kept for backward); c = f·cPrev + i·g, tanhC = tanh(c), h = o·tanhC, each (batch, hidden).
  virtual void lstmCellForward(float* gates, const float* cPrev, float* c, float* tanhC, float* h, int64_t batch, int64_t hidden) = 0;
  // Backward from those activations: dh = dhOut + dhNext, dc = dh·o·(1 − tanhC²) + dcNext; the
  // pre-activations' gradients into dGates, and dcNext becomes dc·f (for the step before).
  virtual void lstmCellBackward(const float* gates, const float* tanhC, const float* cPrev, const float* dhOut, const float* dhNext,
                                float* dcNext, float* dGates, int64_t batch, int64_t hidden) = 0;

  // ---- Loss ----------------------------------------------------------------------------------
  // Mean softmax cross-entropy of (n, k) logits against labels in [0, k): dL/dlogits into
  // gradLogits; stats[0] = the mean loss, stats[1] = rows whose arg-max equals the label.
  virtual void softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t k, float* gradLogits,
                                   double* stats) = 0;

  // ---- Per-parameter lists, one call per step -------------------------------------------------
  // torch.optim.SGD (dampening 0): d = g + wd·p; buf = d at the first step, else m·buf + d;
  // step = d + m·buf (Nesterov) or buf; p −= lr·step.
  virtual void sgdUpdate(const std::vector<SgdSlot>& slots, const SgdHyper& hyper, bool first) = 0;
  // *firstBad = 1 + the index of the first tensor holding a NaN or Inf, or 0.
  virtual void findNonFinite(const std::vector<ConstSpan>& tensors, double* firstBad) = 0;
  // sums[i] += values[i], element-wise (the epoch sums of Accordion's gradient norms).
  virtual void accumulate(const std::vector<Span>& sums, const std::vector<ConstSpan>& values) = 0;
  // Σ x² of each tensor, in double, on the host (waits for the device).
  virtual std::vector<double> sumsOfSquares(const std::vector<ConstSpan>& tensors) = 0;
  // Σ x² over all the tensors together (a global gradient norm for clipping), in double, on the
  // host (waits for the device).
  virtual double totalSumOfSquares(const std::vector<ConstSpan>& tensors) = 0;

  // ---- Ops prepared once per shape -----------------------------------------------------------
  virtual std::unique_ptr<Conv2dOp> conv2d(const Conv2dSpec& spec) = 0;
  virtual std::unique_ptr<BatchNorm2dOp> batchNorm2d(const BatchNormSpec& spec) = 0;
  virtual std::unique_ptr<MaxPool2dOp> maxPool2d(const Pool2dSpec& spec) = 0;

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
