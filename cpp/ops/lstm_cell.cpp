// The LSTM cell's gates for one time step, forward and backward (gates i, f, g, o).
#include <cmath>

#include "ops/cpu_backend.h"

namespace accordion {

namespace {
inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
}  // namespace

void CpuBackend::lstmCellForward(float* gates, const float* cPrev, float* c, float* tanhC, float* h, int64_t batch, int64_t hidden) {
  const int64_t g4 = 4 * hidden;
  for (int64_t b = 0; b < batch; ++b) {
    float* gb = gates + b * g4;
    for (int64_t k = 0; k < hidden; ++k) {
      const int64_t s = b * hidden + k;
      const float i = sigmoid(gb[k]), f = sigmoid(gb[hidden + k]), g = std::tanh(gb[2 * hidden + k]), o = sigmoid(gb[3 * hidden + k]);
      gb[k] = i, gb[hidden + k] = f, gb[2 * hidden + k] = g, gb[3 * hidden + k] = o;
      const float cell = f * cPrev[s] + i * g;
      c[s] = cell;
      tanhC[s] = std::tanh(cell);
      h[s] = o * tanhC[s];
    }
  }
}

void CpuBackend::lstmCellBackward(const float* gates, const float* tanhC, const float* cPrev, const float* dhOut, const float* dhNext,
                                  float* dcNext, float* dGates, int64_t batch, int64_t hidden) {
  const int64_t g4 = 4 * hidden;
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t k = 0; k < hidden; ++k) {
      const int64_t s = b * hidden + k;
      const float* gb = gates + b * g4;
      float* dg = dGates + b * g4;
      const float i = gb[k], f = gb[hidden + k], g = gb[2 * hidden + k], o = gb[3 * hidden + k];
      const float dh = dhOut[s] + dhNext[s];
      const float dc = dh * o * (1.0f - tanhC[s] * tanhC[s]) + dcNext[s];
      dg[k] = dc * g * i * (1.0f - i);
      dg[hidden + k] = dc * cPrev[s] * f * (1.0f - f);
      dg[2 * hidden + k] = dc * i * (1.0f - g * g);
      dg[3 * hidden + k] = dh * tanhC[s] * o * (1.0f - o);
      dcNext[s] = dc * f;
    }
}

}  // namespace accordion
