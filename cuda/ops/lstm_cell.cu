// The LSTM cell's gates for one time step, forward and backward (gates i, f, g, o): one thread per
// (batch row, hidden unit), reading that unit's four gates.
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void cellForward(float* __restrict__ gates, const float* __restrict__ cPrev, float* __restrict__ c, float* __restrict__ tanhC,
                            float* __restrict__ h, int64_t batch, int64_t hidden) {
  const int64_t n = batch * hidden, stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t s = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; s < n; s += stride) {
    const int64_t b = s / hidden, k = s - b * hidden;
    float* gb = gates + b * 4 * hidden;
    const float i = sigmoid(gb[k]), f = sigmoid(gb[hidden + k]), g = tanhf(gb[2 * hidden + k]), o = sigmoid(gb[3 * hidden + k]);
    gb[k] = i, gb[hidden + k] = f, gb[2 * hidden + k] = g, gb[3 * hidden + k] = o;
    const float cell = f * cPrev[s] + i * g, tanhCell = tanhf(cell);
    c[s] = cell;
    tanhC[s] = tanhCell;
    h[s] = o * tanhCell;
  }
}

__global__ void cellBackward(const float* __restrict__ gates, const float* __restrict__ tanhC, const float* __restrict__ cPrev,
                             const float* __restrict__ dhOut, const float* __restrict__ dhNext, float* __restrict__ dcNext,
                             float* __restrict__ dGates, int64_t batch, int64_t hidden) {
  const int64_t n = batch * hidden, stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t s = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; s < n; s += stride) {
    const int64_t b = s / hidden, k = s - b * hidden;
    const float* gb = gates + b * 4 * hidden;
    float* dg = dGates + b * 4 * hidden;
    const float i = gb[k], f = gb[hidden + k], g = gb[2 * hidden + k], o = gb[3 * hidden + k], t = tanhC[s];
    const float dh = dhOut[s] + dhNext[s];
    const float dc = dh * o * (1.0f - t * t) + dcNext[s];
    dg[k] = dc * g * i * (1.0f - i);
    dg[hidden + k] = dc * cPrev[s] * f * (1.0f - f);
    dg[2 * hidden + k] = dc * i * (1.0f - g * g);
    dg[3 * hidden + k] = dh * t * o * (1.0f - o);
    dcNext[s] = dc * f;
  }
}

}  // namespace

void CudaBackend::lstmCellForward(float* gates, const float* cPrev, float* c, float* tanhC, float* h, int64_t batch, int64_t hidden) {
  if (batch <= 0 || hidden <= 0) return;
  cellForward<<<blocksFor(batch * hidden), kThreads, 0, stream()>>>(gates, cPrev, c, tanhC, h, batch, hidden);
  checkLaunch("lstmCellForward");
}

void CudaBackend::lstmCellBackward(const float* gates, const float* tanhC, const float* cPrev, const float* dhOut, const float* dhNext,
                                   float* dcNext, float* dGates, int64_t batch, int64_t hidden) {
  if (batch <= 0 || hidden <= 0) return;
  cellBackward<<<blocksFor(batch * hidden), kThreads, 0, stream()>>>(gates, tanhC, cPrev, dhOut, dhNext, dcNext, dGates, batch, hidden);
  checkLaunch("lstmCellBackward");
}

}  // namespace accordion::cuda
