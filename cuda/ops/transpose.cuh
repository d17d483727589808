// Batched transposition on the device, with a change of element type on the way: the layout
// conversions of channels-last activations (NCHW ↔ NHWC, as (N, C, H·W) ↔ (N, H·W, C)) and of
// convolution filters (PyTorch's OIHW ↔ cuDNN's channels-last KRSC, as (O, I, k·k) ↔ (O, k·k, I)).
#pragma once
#include <cstdint>

#include "ops/cuda_backend.h"

namespace accordion::cuda {

enum class Element { Fp32, Bf16 };  // a float, or bf16's 16 bits

// dst[b][c][r] = src[b][r][c] for b < batch, r < rows, c < cols, enqueued on the backend's stream;
// src and dst do not overlap. Into bf16 the values are rounded as the CPU rounds them
// (ops/bf16_rounding.h); out of bf16 they are widened exactly.
void transposeBatched(CudaBackend& backend, const void* src, Element in, void* dst, Element out, int64_t batch, int64_t rows,
                      int64_t cols);

}  // namespace accordion::cuda
