// bf16 operands for cuDNN and cuBLAS (--precision bf16 on the GPU): fp32 values rounded as the
// CPU rounds them (ops/bf16_rounding.h) into a bf16 copy, and bf16 results widened back to fp32.
#pragma once
#include <cstdint>
#include <memory>

#include "ops/cuda_backend.h"

namespace accordion::cuda {

// A copy of x[0..n) in bf16 (its bits), in the backend's pool, enqueued on its stream.
std::shared_ptr<void> bf16Copy(CudaBackend& backend, const float* x, int64_t n);
// Storage for n bf16 values, for a result to widen afterwards.
std::shared_ptr<void> bf16Storage(CudaBackend& backend, int64_t n);
// y[i] = x[i] as fp32 (exact).
void widenBf16(CudaBackend& backend, const void* x, float* y, int64_t n);

}  // namespace accordion::cuda
