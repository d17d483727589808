// PowerSGD's passes over each matrix. They are fused, memory-bound OpenMP loops rather than BLAS
// calls: with rank r ≤ a few, P = M·Q and Qᵀ = P̂ᵀ·M are matrix-vector products that BLAS runs no
// faster, and fusing them with the error-feedback updates saves whole passes over the gradients.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "ops/cpu_compression_kernels.h"

namespace accordion {

namespace {

// Qᵀ (r, cols) from Q (cols, r), so every kernel reads Q contiguously along a row of M.
void transposeQ(const float* q, int64_t cols, int64_t r, float* qt) {
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t k = 0; k < r; ++k) qt[k * cols + j] = q[j * r + k];
}

// M = g + e, stored in e; P = M·Q (rows, r).
void feedbackAndProject(const float* g, float* memory, const float* qt, float* p, int64_t rows, int64_t cols, int64_t r) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t i = 0; i < rows; ++i) {
    const float* gRow = g + i * cols;
    float* mRow = memory + i * cols;
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) mRow[j] += gRow[j];
    for (int64_t k = 0; k < r; ++k) {
      const float* qk = qt + k * cols;
      float dot = 0;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < cols; ++j) dot += mRow[j] * qk[j];
      p[i * r + k] = dot;
    }
  }
}

// Qᵀ = P̂ᵀ·M (r, cols): each thread owns a block of columns and walks all rows.
void projectBack(const float* memory, const float* p, float* qt, int64_t rows, int64_t cols, int64_t r) {
  std::fill(qt, qt + r * cols, 0.0f);
#pragma omp parallel if (rows * cols > 65536)
  {
    const int threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = cols * t / threads, end = cols * (t + 1) / threads;
    for (int64_t i = 0; i < rows; ++i) {
      const float* mRow = memory + i * cols;
      for (int64_t k = 0; k < r; ++k) {
        const float pik = p[i * r + k];
        float* qk = qt + k * cols;
#pragma omp simd
        for (int64_t j = begin; j < end; ++j) qk[j] += pik * mRow[j];
      }
    }
  }
}

// out = P̂·Qᵀ written to g; e = M − out.
void decompress(const float* p, const float* qt, float* g, float* memory, int64_t rows, int64_t cols, int64_t r) {
#pragma omp parallel for schedule(static) if (rows * cols > 65536)
  for (int64_t i = 0; i < rows; ++i) {
    float* gRow = g + i * cols;
    float* mRow = memory + i * cols;
    const float p0 = p[i * r];
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) gRow[j] = p0 * qt[j];
    for (int64_t k = 1; k < r; ++k) {
      const float pk = p[i * r + k];
      const float* qk = qt + k * cols;
#pragma omp simd
      for (int64_t j = 0; j < cols; ++j) gRow[j] += pk * qk[j];
    }
#pragma omp simd
    for (int64_t j = 0; j < cols; ++j) mRow[j] -= gRow[j];
  }
}

}  // namespace

void CpuCompressionKernels::powerSgdProject(const std::vector<PowerSgdMatrix>& matrices) {
  // Each matrix's slice of the Qᵀ buffer is free until projectBack fills it: it holds Q transposed.
  for (const PowerSgdMatrix& m : matrices) {
    transposeQ(m.q, m.cols, m.rank, m.qt);
    feedbackAndProject(m.grad, m.memory, m.qt, m.p, m.rows, m.cols, m.rank);
  }
}

void CpuCompressionKernels::powerSgdProjectBack(const std::vector<PowerSgdMatrix>& matrices, float eps) {
  for (const PowerSgdMatrix& m : matrices) {
    orthogonalizeColumns(m.p, m.rows, m.rank, eps);
    projectBack(m.memory, m.p, m.qt, m.rows, m.cols, m.rank);
  }
}

void CpuCompressionKernels::powerSgdDecompress(const std::vector<PowerSgdMatrix>& matrices, float scale) {
  for (const PowerSgdMatrix& m : matrices)
    for (int64_t i = 0; i < m.rank * m.cols; ++i) m.qt[i] *= scale;
  for (const PowerSgdMatrix& m : matrices) {
    for (int64_t j = 0; j < m.cols; ++j)
      for (int64_t c = 0; c < m.rank; ++c) m.q[j * m.rank + c] = m.qt[c * m.cols + j];
    decompress(m.p, m.qt, m.grad, m.memory, m.rows, m.cols, m.rank);
  }
}

void orthogonalizeColumns(float* m, int64_t rows, int64_t cols, float eps) {
  for (int64_t i = 0; i < cols; ++i) {
    double norm = 0;
    for (int64_t k = 0; k < rows; ++k) norm += static_cast<double>(m[k * cols + i]) * m[k * cols + i];
    const float scale = static_cast<float>(1.0 / (std::sqrt(norm) + eps));
    for (int64_t k = 0; k < rows; ++k) m[k * cols + i] *= scale;
    for (int64_t j = i + 1; j < cols; ++j) {
      double dot = 0;
      for (int64_t k = 0; k < rows; ++k) dot += static_cast<double>(m[k * cols + i]) * m[k * cols + j];
      const float d = static_cast<float>(dot);
      for (int64_t k = 0; k < rows; ++k) m[k * cols + j] -= d * m[k * cols + i];
    }
  }
}

}  // namespace accordion
