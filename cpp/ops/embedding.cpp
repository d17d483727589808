// Embedding: rows of a table gathered by token id, and the gradient added back row by row.
#include <cstring>

#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::embeddingForward(const float* table, const int32_t* ids, float* y, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(y + r * width, table + ids[r] * width, width * sizeof(float));
}

void CpuBackend::embeddingBackward(const float* dy, const int32_t* hostIds, float* dTable, int64_t rows, int64_t width) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = dTable + hostIds[r] * width;
    const float* d = dy + r * width;
    for (int64_t k = 0; k < width; ++k) row[k] += d[k];
  }
}

}  // namespace accordion
