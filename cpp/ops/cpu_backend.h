// The CPU implementation of every op: oneDNN for convolution and max pooling, OpenBLAS
// for the linear layers, OpenMP loops for the rest. Activations are channels-last (NHWC), the
// layout oneDNN's convolutions consume without reorders. Work runs synchronously on the calling
// thread (and OpenMP's), so synchronize() has nothing to wait for.
#pragma once
#include "ops/backend.h"

namespace accordion {

class CpuBackend : public Backend {
 public:
  CpuBackend();
  ~CpuBackend() override;

  Device device() const override { return Device::cpu(); }
  std::shared_ptr<void> allocate(size_t bytes) override { return hostAllocator().allocate(bytes); }
  bool channelsLast() const override { return true; }
  void upload(void* dst, const void* hostSrc, size_t bytes) override;
  void download(void* hostDst, const void* src, size_t bytes) override;
  void copy(void* dst, const void* src, size_t bytes) override;
  void fill(float* data, int64_t n, float value) override;
  std::shared_ptr<void> uploadAhead(const void* hostSrc, size_t bytes, std::shared_ptr<const void> hostOwner) override;
  void synchronize() override {}
  MemoryStats memoryStats() const override { return {}; }

  void reluForward(const float* x, float* y, int64_t n) override;
  void reluBackward(const float* y, const float* dy, float* dx, int64_t n) override;
  void add(const float* a, const float* b, float* out, int64_t n) override;
  void scale(const float* x, float* y, int64_t n, float s) override;
  void dropoutForward(const float* x, const uint8_t* keep, float* y, int64_t n, float scale) override;
  void dropoutBackward(const float* dy, const uint8_t* keep, float* dx, int64_t n, float scale) override;

  void globalAvgPoolForward(const float* x, float* y, int64_t n, int64_t c, int64_t h, int64_t w) override;
  void globalAvgPoolBackward(const float* dy, float* dx, int64_t n, int64_t c, int64_t h, int64_t w) override;
  void flattenForward(const float* x, float* y, int64_t n, int64_t c, int64_t h, int64_t w) override;
  void flattenBackward(const float* dy, float* dx, int64_t n, int64_t c, int64_t h, int64_t w) override;
  void uploadImages(const float* hostNchw, float* images, int64_t n, int64_t c, int64_t h, int64_t w) override;

  void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, const float* a, const float* b, float* c,
            bool accumulate) override;
  void broadcastRows(const float* row, float* y, int64_t rows, int64_t cols) override;
  void columnSums(const float* x, float* sums, int64_t rows, int64_t cols) override;

  void embeddingForward(const float* table, const int32_t* ids, float* y, int64_t rows, int64_t width) override;
  void embeddingBackward(const float* dy, const int32_t* hostIds, float* dTable, int64_t rows, int64_t width) override;

  void lstmCellForward(float* gates, const float* cPrev, float* c, float* tanhC, float* h, int64_t batch, int64_t hidden) override;
  void lstmCellBackward(const float* gates, const float* tanhC, const float* cPrev, const float* dhOut, const float* dhNext,
                        float* dcNext, float* dGates, int64_t batch, int64_t hidden) override;

  void softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t k, float* gradLogits,
                           double* stats) override;

  void sgdUpdate(const std::vector<SgdSlot>& slots, const SgdHyper& hyper, bool first) override;
  void findNonFinite(const std::vector<ConstSpan>& tensors, double* firstBad) override;
  void accumulate(const std::vector<Span>& sums, const std::vector<ConstSpan>& values) override;
  std::vector<double> sumsOfSquares(const std::vector<ConstSpan>& tensors) override;
  double totalSumOfSquares(const std::vector<ConstSpan>& tensors) override;

  std::unique_ptr<Conv2dOp> conv2d(const Conv2dSpec& spec) override;
  std::unique_ptr<BatchNorm2dOp> batchNorm2d(const BatchNormSpec& spec) override;
  std::unique_ptr<MaxPool2dOp> maxPool2d(const Pool2dSpec& spec) override;

  CompressionKernels& compression() override { return *compression_; }

 private:
  std::unique_ptr<CompressionKernels> compression_;
};

// Layout conversions between PyTorch's NCHW and the CPU's NHWC.
void nchwToNhwc(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w);
void nhwcToNchw(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w);

}  // namespace accordion
