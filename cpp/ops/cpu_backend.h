// The CPU implementation of every op: oneDNN for convolution and max pooling, OpenBLAS (or
// oneDNN, ops/cpu_sgemm.h) for the linear layers, OpenMP loops for the rest. Activations are
// channels-last (NHWC), the layout oneDNN's convolutions consume without reorders. Work runs
// synchronously on the calling thread (and OpenMP's), so synchronize() has nothing to wait for.
#pragma once
#include <vector>

#include "core/block_cache.h"
#include "ops/backend.h"
#include "ops/cast_cache.h"

namespace accordion {

class CpuBackend : public Backend {
 public:
  CpuBackend();
  ~CpuBackend() override;

  Device device() const override { return Device::cpu(); }
  std::shared_ptr<void> allocate(size_t bytes) override { return blocks_.allocate(bytes); }
  bool channelsLast() const override { return true; }
  void synchronize() override {}
  MemoryStats memoryStats() const override { return {blocks_.allocated(), blocks_.peak()}; }
  void resetPeakMemory() override { blocks_.resetPeak(); }

#define ACCORDION_OP(Result, name, parameters) Result name parameters override;
#include "ops/device_ops.def"
#undef ACCORDION_OP

  CompressionKernels& compression() override { return *compression_; }

  void setParameters(std::vector<ConstSpan> parameters) override { casts_.setParameters(parameters); }
  void beginCastScope() override { casts_.begin(); }
  void endCastScope() override { casts_.end(); }

 private:
  // `b` (k·n values) as a bf16 product takes it: its bf16 encoding (T = uint16_t) where the CPU
  // multiplies bf16, else its values rounded to bf16 (T = float); the scope's kept copy when b is a
  // parameter.
  template <class T>
  const T* castOperand(const float* b, int64_t count);
  std::unique_ptr<CompressionKernels> compression_;
  BlockCache blocks_;
  struct Copies {
    std::vector<uint16_t> bf16;  // natively
    std::vector<float> rounded;  // elsewhere
  };
  CastCache<Copies> casts_;
};

// Layout conversions between PyTorch's NCHW and the CPU's NHWC.
void nchwToNhwc(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w);
void nhwcToNchw(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w);

}  // namespace accordion
