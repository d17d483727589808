// Per-parameter statistics of the gradients: the NaN/Inf check before an update, the epoch sums
// and squared norms behind Accordion's decisions, and the global norm that clipping scales by.
#include <cmath>
#include <cstdint>

#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::findNonFinite(const std::vector<ConstSpan>& tensors, double* firstBad) {
  *firstBad = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const float* g = tensors[k].data;
    const int64_t n = tensors[k].size;
    // A value is NaN or infinite when its exponent bits are all ones: an integer test over every
    // element that the compiler vectorises (isfinite's short-circuit kept it scalar).
    const auto* bits = reinterpret_cast<const uint32_t*>(g);
    uint32_t nonFinite = 0;
#pragma omp parallel for simd reduction(| : nonFinite) schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) nonFinite |= static_cast<uint32_t>((bits[i] & 0x7F800000u) == 0x7F800000u);
    if (nonFinite) {
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

// The norm from one sequential sum over every element, tensor after tensor.
void CpuBackend::clipTotalNorm(const std::vector<Span>& tensors, double maxNorm) {
  double total = 0;
  for (const Span& t : tensors)
    for (int64_t i = 0; i < t.size; ++i) total += static_cast<double>(t.data[i]) * t.data[i];
  const double norm = std::sqrt(total);
  if (!(norm > maxNorm)) return;
  const float factor = static_cast<float>(maxNorm / (norm + 1e-6));
  for (const Span& t : tensors) scale(t.data, t.data, t.size, factor);
}

}  // namespace accordion
