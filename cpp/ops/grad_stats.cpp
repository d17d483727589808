// Per-parameter statistics of the gradients: the NaN/Inf check before an update, and the epoch sums
// and squared norms behind Accordion's decisions.
#include <cmath>

#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::findNonFinite(const std::vector<ConstSpan>& tensors, double* firstBad) {
  *firstBad = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const float* g = tensors[k].data;
    const int64_t n = tensors[k].size;
    bool finite = true;
#pragma omp parallel for simd reduction(&& : finite) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) finite = finite && std::isfinite(g[i]);
    if (!finite) {
      *firstBad = static_cast<double>(k + 1);
      return;
    }
  }
}

void CpuBackend::accumulate(const std::vector<Span>& sums, const std::vector<ConstSpan>& values) {
  for (size_t k = 0; k < sums.size(); ++k) {
    float* sum = sums[k].data;
    const float* g = values[k].data;
    const int64_t n = sums[k].size;
#pragma omp parallel for simd schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) sum[i] += g[i];
  }
}

std::vector<double> CpuBackend::sumsOfSquares(const std::vector<ConstSpan>& tensors) {
  std::vector<double> out;
  out.reserve(tensors.size());
  for (const ConstSpan& t : tensors) {
    const float* v = t.data;
    const int64_t n = t.size;
    double total = 0;
#pragma omp parallel for simd reduction(+ : total) schedule(static) if (n > 65536)
    for (int64_t k = 0; k < n; ++k) total += static_cast<double>(v[k]) * v[k];
    out.push_back(total);
  }
  return out;
}

}  // namespace accordion
