// The arithmetic of the gradient compressors, apart from the reducer that orchestrates them
// (levels, buffers, collectives, accounting: compress/reducer.h). Each call covers every tensor of
// one step, so a device implementation can batch matrices of equal shape into one launch. All
// pointers are on the kernels' device; the kernels are listed, with what each computes, in
// ops/compression_ops.def.
#pragma once
#include <cstdint>
#include <vector>

namespace accordion {

// One weight matrix of a PowerSGD step, viewed as (rows, cols) = (out, in·kh·kw).
struct PowerSgdMatrix {
  float* grad;    // (rows, cols): the local gradient g in, the averaged approximation out
  float* memory;  // (rows, cols): the error feedback e; holds M = g + e during the step, M − out after
  float* q;       // (cols, rank): Q, reused by the next step (warm start)
  float* p;       // (rows, rank): this matrix's part of the step's P buffer (the one all-reduce)
  float* qt;      // (rank, cols): this matrix's part of the step's Qᵀ buffer (the other all-reduce)
  int64_t rows, cols, rank;
};

// One tensor of a TopK step.
struct TopKTensor {
  float* grad;    // (size,): the local gradient in, the averaged sparse gradient out
  float* memory;  // (size,): the error feedback e; a = g + e, then a − sparse(a)
  float* send;    // (2·count,): this tensor's part of the all-gathered buffer: indices (int32 bits), values
  int64_t size, count;
  int64_t offset;  // of `send` in this worker's block of the gathered buffer
};

// A contiguous run of floats.
struct Span {
  float* data;
  int64_t size;
};

class CompressionKernels {
 public:
  virtual ~CompressionKernels() = default;

#define ACCORDION_OP(Result, name, parameters) virtual Result name parameters = 0;
#include "ops/compression_ops.def"
#undef ACCORDION_OP
};

}  // namespace accordion
