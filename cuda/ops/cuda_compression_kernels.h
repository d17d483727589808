// The compressors' kernels on a CUDA GPU (ops/compression_kernels.h), on the backend's stream, with a
// constant number of launches per step whatever the number of tensors:
//   PowerSGD  M = g + e in one multi-tensor pass; P = M·Q and Qᵀ = P̂ᵀ·M as batched cuBLAS GEMMs, one
//             call per group of matrices of equal shape; the Gram-Schmidt of every P in one launch
//             (a block per matrix); decompression fused with the new error e = M − P̂·Qᵀ.
//   TopK      a = g + e fused into the first pass of a radix select over the magnitude bits (three
//             histogram passes of 11, 11 and 9 bits for all tensors at once, each followed by a
//             one-block-per-tensor choice of the digit on the device, so the host never waits), then
//             an ordered gather: per-chunk counts, their prefix sums per tensor, and a block scan
//             that writes the winners in ascending index order (ties: lowest index, as on the CPU).
//             The average of the gathered pairs adds one worker's pairs per launch, in rank order:
//             no two threads of a launch touch one element, so the result is deterministic.
//   dense     pack and unpack as multi-tensor copies.
#pragma once
#include <memory>
#include <vector>

#include "ops/compression_kernels.h"

namespace accordion::cuda {

class CudaBackend;

class CudaCompressionKernels : public CompressionKernels {
 public:
  explicit CudaCompressionKernels(CudaBackend& backend) : backend_(backend) {}

#define ACCORDION_OP(Result, name, parameters) Result name parameters override;
#include "ops/compression_ops.def"
#undef ACCORDION_OP

 private:
  CudaBackend& backend_;
  // TopK's scratch: histograms, per-tensor selection state and per-chunk counts, reused between steps.
  std::shared_ptr<void> topKScratch_;
  size_t topKScratchBytes_ = 0;
};

}  // namespace accordion::cuda
