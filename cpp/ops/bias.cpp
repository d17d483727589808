// A bias over the rows of a matrix: broadcast into every row (forward), summed over the rows
// (its gradient).
#include <algorithm>

#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::broadcastRows(const float* row, float* y, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) std::copy(row, row + cols, y + r * cols);
}

void CpuBackend::columnSums(const float* x, float* sums, int64_t rows, int64_t cols) {
  std::fill(sums, sums + cols, 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) sums[j] += x[r * cols + j];
}

}  // namespace accordion
