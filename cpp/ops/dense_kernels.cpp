// The dense exchange: every uncompressed tensor packed into one buffer for one all-reduce.
#include <cstring>

#include "ops/cpu_compression_kernels.h"

namespace accordion {

void CpuCompressionKernels::pack(const std::vector<Span>& tensors, float* buffer) {
  for (const Span& t : tensors) {
    std::memcpy(buffer, t.data, t.size * sizeof(float));
    buffer += t.size;
  }
}

void CpuCompressionKernels::unpack(const float* buffer, const std::vector<Span>& tensors, float scale) {
  for (const Span& t : tensors) {
    for (int64_t k = 0; k < t.size; ++k) t.data[k] = buffer[k] * scale;
    buffer += t.size;
  }
}

}  // namespace accordion
