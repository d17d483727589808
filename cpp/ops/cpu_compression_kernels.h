// The compressors' kernels on the CPU: fused, memory-bound OpenMP passes.
#pragma once
#include <vector>

#include "ops/compression_kernels.h"

namespace accordion {

class CpuCompressionKernels : public CompressionKernels {
 public:
  void powerSgdProject(const std::vector<PowerSgdMatrix>& matrices) override;
  void powerSgdProjectBack(const std::vector<PowerSgdMatrix>& matrices, float eps) override;
  void powerSgdDecompress(const std::vector<PowerSgdMatrix>& matrices, float scale) override;
  void topKSelect(const std::vector<TopKTensor>& tensors) override;
  void topKCombine(const std::vector<TopKTensor>& tensors, const float* gathered, int world, int64_t perWorker,
                   float scale) override;
  void pack(const std::vector<Span>& tensors, float* buffer) override;
  void unpack(const float* buffer, const std::vector<Span>& tensors, float scale) override;

 private:
  std::vector<int32_t> indices_;  // TopK's selection, reused between calls
};

// Modified Gram-Schmidt on the columns of a row-major (rows, cols) matrix, in place:
// col_i ← col_i / (‖col_i‖ + eps), then col_j −= (col_i·col_j) col_i for j > i.
void orthogonalizeColumns(float* matrix, int64_t rows, int64_t cols, float eps);

// Indices (ascending) of the `count` entries of largest magnitude; among equal magnitudes the lowest
// indices win. Linear time (radix select on the float bits), multi-threaded.
void selectTopK(const float* values, int64_t n, int64_t count, std::vector<int32_t>& indices);

}  // namespace accordion
