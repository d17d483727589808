// Mean softmax cross-entropy over the rows, its gradient, and the rows predicted right.
#include <cmath>
#include <string>

#include "ops/cpu_backend.h"

namespace accordion {

void CpuBackend::softmaxCrossEntropy(const float* logits, const int32_t* labels, int64_t n, int64_t k, float* gradLogits,
                                     double* stats) {
  for (int64_t r = 0; r < n; ++r)
    if (labels[r] < 0 || labels[r] >= k)
      throw invalidArgument("label " + std::to_string(labels[r]) + " of sample " + std::to_string(r) + " is outside 0.." +
                            std::to_string(k - 1));
  double total = 0;
  int64_t hits = 0;
  const float invN = 1.0f / static_cast<float>(n);
  // Rows are independent; each row's sums run in float over the classes (language models have tens
  // of thousands), its log-sum in double.
#pragma omp parallel for reduction(+ : total, hits) schedule(static) if (n * k > 65536)
  for (int64_t r = 0; r < n; ++r) {
    const float* z = logits + r * k;
    float* g = gradLogits + r * k;
    const int32_t label = labels[r];
    int64_t best = 0;
    float maxZ = z[0];
    for (int64_t j = 1; j < k; ++j)
      if (z[j] > maxZ) maxZ = z[j], best = j;
    float sum = 0;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < k; ++j) {
      g[j] = std::exp(z[j] - maxZ);
      sum += g[j];
    }
    const double logSum = std::log(static_cast<double>(sum));
    total += logSum - static_cast<double>(z[label] - maxZ);
    const float scale = invN / sum;
#pragma omp simd
    for (int64_t j = 0; j < k; ++j) g[j] *= scale;
    g[label] -= invN;
    hits += best == label;
  }
  stats[0] = total / static_cast<double>(n);
  stats[1] = static_cast<double>(hits);
}

}  // namespace accordion
