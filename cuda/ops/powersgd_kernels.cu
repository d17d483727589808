// PowerSGD on the GPU: the error feedback as one multi-tensor pass, the two projections as batched
// cuBLAS GEMMs grouped by shape, the orthogonalisation of every P in one launch, and decompression
// fused with the new error. Row-major buffers map onto column-major cuBLAS as in ops/gemm.cu: a
// row-major (r, c) buffer is, to cuBLAS, its (c, r) transpose with leading dimension c. So
//   P (rows, r)  = M·Q   is Pᵀ = Qᵀ·Mᵀ:   sgemm(N, N, r, rows, cols,  Q ld r, M ld cols,  P ld r)
//   Qᵀ (r, cols) = P̂ᵀ·M  is Q  = Mᵀ·P̂:    sgemm(N, T, cols, r, rows,  M ld cols, P̂ ld r,  Qᵀ ld cols)
#include <map>
#include <string>
#include <tuple>

#include "ops/cuda_compression_kernels.h"
#include "lib/cublas.h"
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

struct AddDoubles {
  __device__ double operator()(double a, double b) const { return a + b; }
};

struct GemmShape {
  int transa, transb, m, n, k, lda, ldb, ldc;
};

// A matrix's rows, columns and rank as cuBLAS takes them (int), or an error naming the one too large.
std::tuple<int, int, int> blasSizes(const PowerSgdMatrix& m) {
  return {cublas::dimension(m.rows, "PowerSGD", "rows"), cublas::dimension(m.cols, "PowerSGD", "columns"),
          cublas::dimension(m.rank, "PowerSGD", "rank")};
}

// One batched GEMM per group of matrices of equal (rows, cols, rank), so a step costs as many cuBLAS
// calls as it has distinct shapes. `operands(matrix)` gives its A, B and C; the pointer arrays go to
// the device as cached tables (the buffers are the same every step).
template <typename ShapeOf, typename Operands>
void groupedGemms(CudaBackend& backend, const std::vector<PowerSgdMatrix>& matrices, ShapeOf shapeOf, Operands operands, const char* what) {
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<const PowerSgdMatrix*>> groups;
  for (const PowerSgdMatrix& m : matrices) groups[{m.rows, m.cols, m.rank}].push_back(&m);
  const float one = 1.0f, zero = 0.0f;
  for (const auto& [key, members] : groups) {
    const size_t count = members.size();
    std::vector<const float*> pointers(3 * count);  // every A, then every B, then every C
    for (size_t i = 0; i < count; ++i) {
      const auto [a, b, c] = operands(*members[i]);
      pointers[i] = a;
      pointers[count + i] = b;
      pointers[2 * count + i] = c;
    }
    const auto* table = static_cast<const float* const*>(backend.deviceTable(pointers.data(), pointers.size() * sizeof(float*)));
    const GemmShape s = shapeOf(*members.front());
    cublas::check(cublas::api().sgemmBatched(backend.cublas(false), s.transa, s.transb, s.m, s.n, s.k, &one, table, s.lda, table + count,
                                             s.ldb, &zero, const_cast<float* const*>(table + 2 * count), s.ldc,
                                             static_cast<int>(count)),
                  what);
  }
}

struct OrthogonalizeEntry {
  float* p;
  int64_t rows, rank;
};

// Modified Gram-Schmidt on the columns of one P (rows, rank) per block, sums in double as on the
// CPU: col_i ← col_i / (‖col_i‖ + eps), then col_j −= (col_i·col_j) col_i for j > i. Each thread
// keeps the same rows throughout, so only the reductions need the block.
__global__ void __launch_bounds__(kThreads) orthogonalizeKernel(const OrthogonalizeEntry* matrices, float eps) {
  const OrthogonalizeEntry m = matrices[blockIdx.x];
  const int64_t r = m.rank;
  for (int64_t i = 0; i < r; ++i) {
    double norm = 0.0;
    for (int64_t k = threadIdx.x; k < m.rows; k += blockDim.x) norm += static_cast<double>(m.p[k * r + i]) * m.p[k * r + i];
    norm = blockAllReduce(norm, AddDoubles{}, 0.0);
    const float scale = static_cast<float>(1.0 / (sqrt(norm) + eps));
    for (int64_t k = threadIdx.x; k < m.rows; k += blockDim.x) m.p[k * r + i] *= scale;
    for (int64_t j = i + 1; j < r; ++j) {
      double dot = 0.0;
      for (int64_t k = threadIdx.x; k < m.rows; k += blockDim.x) dot += static_cast<double>(m.p[k * r + i]) * m.p[k * r + j];
      const float d = static_cast<float>(blockAllReduce(dot, AddDoubles{}, 0.0));
      for (int64_t k = threadIdx.x; k < m.rows; k += blockDim.x) m.p[k * r + j] -= d * m.p[k * r + i];
    }
  }
}

// Qᵀ ← Qᵀ·scale and Q ← (Qᵀ)ᵀ, over the rank·cols elements of each matrix's Qᵀ.
struct ScaleQEntry {
  float* qt;
  float* q;
  int64_t cols, rank;
  int64_t size;  // rank·cols
};

__global__ void __launch_bounds__(kThreads) scaleQKernel(const ScaleQEntry* tensors, const TensorChunk* chunks, float scale) {
  const TensorChunk chunk = chunks[blockIdx.x];
  const ScaleQEntry t = tensors[chunk.tensor];
  forEachInChunk(
      t.size, chunk.chunk, false, [](int64_t) {},
      [&](int64_t e) {
        const int64_t k = e / t.cols, j = e - k * t.cols;
        const float v = t.qt[e] * scale;
        t.qt[e] = v;
        t.q[j * t.rank + k] = v;
      });
}

// out = P̂·Qᵀ into the gradient and e = M − out, element (i, j) of each (rows, cols) matrix: P̂'s row
// and Qᵀ's column are a few floats, read through the caches; M and the gradient stream once.
struct DecompressEntry {
  float* grad;
  float* memory;
  const float* p;
  const float* qt;
  int64_t cols, rank;
  int64_t size;  // rows·cols
};

__global__ void __launch_bounds__(kThreads) decompressKernel(const DecompressEntry* tensors, const TensorChunk* chunks) {
  const TensorChunk chunk = chunks[blockIdx.x];
  const DecompressEntry t = tensors[chunk.tensor];
  forEachInChunk(
      t.size, chunk.chunk, false, [](int64_t) {},
      [&](int64_t e) {
        const int64_t i = e / t.cols, j = e - i * t.cols;
        const float* pRow = t.p + i * t.rank;
        float out = pRow[0] * __ldg(t.qt + j);
        for (int64_t k = 1; k < t.rank; ++k) out += pRow[k] * __ldg(t.qt + k * t.cols + j);
        t.grad[e] = out;
        t.memory[e] -= out;
      });
}

}  // namespace

void CudaCompressionKernels::powerSgdProject(const std::vector<PowerSgdMatrix>& matrices) {
  // M = g + e, kept in e.
  std::vector<Span> memories;
  std::vector<ConstSpan> grads;
  for (const PowerSgdMatrix& m : matrices) {
    memories.push_back({m.memory, m.rows * m.cols});
    grads.push_back({m.grad, m.rows * m.cols});
  }
  backend_.accumulate(memories, grads);
  groupedGemms(
      backend_, matrices,
      [](const PowerSgdMatrix& m) {
        const auto [rows, cols, r] = blasSizes(m);
        return GemmShape{cublas::kNoTranspose, cublas::kNoTranspose, r, rows, cols, r, cols, r};
      },
      [](const PowerSgdMatrix& m) { return std::tuple<const float*, const float*, const float*>{m.q, m.memory, m.p}; },
      "PowerSGD P = M·Q (cublasSgemmBatched)");
}

void CudaCompressionKernels::powerSgdProjectBack(const std::vector<PowerSgdMatrix>& matrices, float eps) {
  if (matrices.empty()) return;
  std::vector<OrthogonalizeEntry> table;
  for (const PowerSgdMatrix& m : matrices) table.push_back({m.p, m.rows, m.rank});
  const auto* deviceTable = static_cast<const OrthogonalizeEntry*>(backend_.deviceTable(table.data(), table.size() * sizeof(table[0])));
  orthogonalizeKernel<<<static_cast<unsigned>(table.size()), kThreads, 0, backend_.stream()>>>(deviceTable, eps);
  checkLaunch("PowerSGD orthogonalisation");
  groupedGemms(
      backend_, matrices,
      [](const PowerSgdMatrix& m) {
        const auto [rows, cols, r] = blasSizes(m);
        return GemmShape{cublas::kNoTranspose, cublas::kTranspose, cols, r, rows, cols, r, cols};
      },
      [](const PowerSgdMatrix& m) { return std::tuple<const float*, const float*, const float*>{m.memory, m.p, m.qt}; },
      "PowerSGD Qᵀ = P̂ᵀ·M (cublasSgemmBatched)");
}

void CudaCompressionKernels::powerSgdDecompress(const std::vector<PowerSgdMatrix>& matrices, float scale) {
  std::vector<ScaleQEntry> qs;
  std::vector<DecompressEntry> outs;
  for (const PowerSgdMatrix& m : matrices) {
    qs.push_back({m.qt, m.q, m.cols, m.rank, m.rank * m.cols});
    outs.push_back({m.grad, m.memory, m.p, m.qt, m.cols, m.rank, m.rows * m.cols});
  }
  launchMultiTensor(backend_, "PowerSGD Q", scaleQKernel, qs, scale);
  launchMultiTensor(backend_, "PowerSGD decompression", decompressKernel, outs);
}

}  // namespace accordion::cuda
