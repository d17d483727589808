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
  void synchronize() override {}
  MemoryStats memoryStats() const override { return {}; }

#define ACCORDION_OP(Result, name, parameters) Result name parameters override;
#include "ops/device_ops.def"
#undef ACCORDION_OP

  CompressionKernels& compression() override { return *compression_; }

 private:
  std::unique_ptr<CompressionKernels> compression_;
};

// Layout conversions between PyTorch's NCHW and the CPU's NHWC.
void nchwToNhwc(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w);
void nhwcToNchw(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w);

}  // namespace accordion
