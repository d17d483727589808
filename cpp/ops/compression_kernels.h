// The arithmetic of the gradient compressors, apart from the reducer that orchestrates them
// (levels, buffers, collectives, accounting: compress/reducer.h). Each call covers every tensor of
// one step, so a device implementation can batch matrices of equal shape into one launch. All
// pointers are on the kernels' device; the formulas are in compress/reducer.h.
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

  // PowerSGD, before the P all-reduce: M = g + e (kept in e) and P = M·Q.
  virtual void powerSgdProject(const std::vector<PowerSgdMatrix>& matrices) = 0;
  // After the P all-reduce: P̂ = Gram-Schmidt(P) (col ← col / (‖col‖ + eps)) and Qᵀ = P̂ᵀ·M.
  virtual void powerSgdProjectBack(const std::vector<PowerSgdMatrix>& matrices, float eps) = 0;
  // After the Qᵀ all-reduce (a sum over the workers): Qᵀ ← Qᵀ·scale (scale = 1/W), Q ← (Qᵀ)ᵀ,
  // out = P̂·Qᵀ into grad, e = M − out.
  virtual void powerSgdDecompress(const std::vector<PowerSgdMatrix>& matrices, float scale) = 0;

  // TopK, before the all-gather: a = g + e (kept in e); the `count` entries of largest |a| (ties:
  // lowest index) go to `send` in ascending index order, and are zeroed in e.
  virtual void topKSelect(const std::vector<TopKTensor>& tensors) = 0;
  // After the all-gather of `world` blocks of `perWorker` floats: grad = scale·Σ_w scatter(pairs_w).
  virtual void topKCombine(const std::vector<TopKTensor>& tensors, const float* gathered, int world, int64_t perWorker,
                           float scale) = 0;

  // Dense exchange: the tensors packed into one buffer, and the summed buffer·scale back.
  virtual void pack(const std::vector<Span>& tensors, float* buffer) = 0;
  virtual void unpack(const float* buffer, const std::vector<Span>& tensors, float scale) = 0;
};

}  // namespace accordion
