// The compressors' kernels on the CPU: fused, memory-bound OpenMP passes.
#pragma once
#include <vector>

#include "ops/compression_kernels.h"

namespace accordion {

class CpuCompressionKernels : public CompressionKernels {
 public:
#define ACCORDION_OP(Result, name, parameters) Result name parameters override;
#include "ops/compression_ops.def"
#undef ACCORDION_OP

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
