// Adaptive average pooling to 1×1: each (n, c) plane of H·W floats → one value (sum, then ·1/(H·W)
// as on the CPU), and its backward broadcast.
//
// NCHW: a team of `lanes` lanes (a power of two up to a warp) works on one plane of contiguous floats,
// so small planes (4×4, 2×2, 1×1) still give each warp one contiguous run of several planes; teams
// take planes grid-stride. 16-byte packs when H·W % 4 == 0 and the pointer allows.
// NHWC: a thread per (n, c) sums its channel over the H·W positions, a warp reading 32 neighbouring
// channels of a position at a time; backward, a thread per element of dx.
// Forward reads x once; backward writes dx once.
#include "ops/kernels.cuh"

namespace accordion::cuda {

namespace {

struct PlaneTeams {
  int64_t planes;
  int planePacks;
  int lanes;  // per plane
};

PlaneTeams planeTeams(int64_t planes, int64_t planePacks) {
  if (planePacks > INT32_MAX) throw invalidArgument("global average pooling over planes of more than 2^31 elements");
  int lanes = 1;
  while (lanes < 32 && lanes < planePacks) lanes *= 2;
  return {planes, static_cast<int>(planePacks), lanes};
}

// Calls visit(plane) for the planes of this thread's team; `plane` is past the end for teams
// without one in the last round, so that every lane of a warp takes every round (and shuffle).
template <typename Visit>
__device__ __forceinline__ void forEachPlane(const PlaneTeams& teams, Visit visit) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = (int64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32, warps = int64_t{gridDim.x} * blockDim.x / 32;
  const int planesPerWarp = 32 / teams.lanes;
  for (int64_t first = warp * planesPerWarp; first < teams.planes; first += warps * planesPerWarp) visit(first + lane / teams.lanes);
}

template <int kWidth>
__global__ void __launch_bounds__(kThreads) averagePlanes(const float* __restrict__ x, float* __restrict__ y, PlaneTeams teams,
                                                          float scale) {
  const int teamLane = threadIdx.x % teams.lanes;
  forEachPlane(teams, [&](int64_t plane) {
    float sum = 0.0f;
    if (plane < teams.planes) {
#pragma unroll 4
      for (int p = teamLane; p < teams.planePacks; p += teams.lanes) {
        const Pack<float, kWidth> v = loadPack<kWidth>(x, plane * teams.planePacks + p);
#pragma unroll
        for (int l = 0; l < kWidth; ++l) sum += v.v[l];
      }
    }
    for (int mask = teams.lanes / 2; mask > 0; mask /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, mask);
    if (plane < teams.planes && teamLane == 0) y[plane] = sum * scale;
  });
}

template <int kWidth>
__global__ void __launch_bounds__(kThreads) broadcastPlanes(const float* __restrict__ dy, float* __restrict__ dx, PlaneTeams teams,
                                                            float scale) {
  const int teamLane = threadIdx.x % teams.lanes;
  forEachPlane(teams, [&](int64_t plane) {
    if (plane >= teams.planes) return;
    const float g = dy[plane] * scale;
    Pack<float, kWidth> v;
#pragma unroll
    for (int l = 0; l < kWidth; ++l) v.v[l] = g;
    for (int p = teamLane; p < teams.planePacks; p += teams.lanes) storePack<kWidth>(dx, plane * teams.planePacks + p, v);
  });
}

__global__ void __launch_bounds__(kThreads) averagePositions(const float* __restrict__ x, float* __restrict__ y, int64_t outputs,
                                                             int64_t channels, int64_t positions, float scale) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < outputs; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t n = i / channels, c = i - n * channels;
    const float* in = x + n * positions * channels + c;
    float sum = 0.0f;
    for (int64_t p = 0; p < positions; ++p) sum += in[p * channels];
    y[i] = sum * scale;
  }
}

__global__ void __launch_bounds__(kThreads) broadcastPositions(const float* __restrict__ dy, float* __restrict__ dx, int64_t inputs,
                                                               int64_t channels, int64_t positions, float scale) {
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < inputs; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t c = i % channels, n = i / (positions * channels);
    dx[i] = dy[n * channels + c] * scale;
  }
}

}  // namespace

void CudaBackend::globalAvgPoolForward(const float* x, float* y, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t planes = n * c, hw = h * w;
  if (planes <= 0) return;
  const float scale = 1.0f / static_cast<float>(hw);
  if (channelsLast()) {
    averagePositions<<<blocksFor(planes), kThreads, 0, stream()>>>(x, y, planes, c, hw, scale);
  } else if (hw % 4 == 0 && packable(x)) {
    const PlaneTeams teams = planeTeams(planes, hw / 4);
    averagePlanes<4><<<blocksFor(planes * teams.lanes), kThreads, 0, stream()>>>(x, y, teams, scale);
  } else {
    const PlaneTeams teams = planeTeams(planes, hw);
    averagePlanes<1><<<blocksFor(planes * teams.lanes), kThreads, 0, stream()>>>(x, y, teams, scale);
  }
  checkLaunch("globalAvgPoolForward");
}

void CudaBackend::globalAvgPoolBackward(const float* dy, float* dx, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t planes = n * c, hw = h * w;
  if (planes <= 0 || hw <= 0) return;
  const float scale = 1.0f / static_cast<float>(hw);
  if (channelsLast()) {
    broadcastPositions<<<blocksFor(planes * hw), kThreads, 0, stream()>>>(dy, dx, planes * hw, c, hw, scale);
  } else if (hw % 4 == 0 && packable(dx)) {
    const PlaneTeams teams = planeTeams(planes, hw / 4);
    broadcastPlanes<4><<<blocksFor(planes * teams.lanes), kThreads, 0, stream()>>>(dy, dx, teams, scale);
  } else {
    const PlaneTeams teams = planeTeams(planes, hw);
    broadcastPlanes<1><<<blocksFor(planes * teams.lanes), kThreads, 0, stream()>>>(dy, dx, teams, scale);
  }
  checkLaunch("globalAvgPoolBackward");
}

}  // namespace accordion::cuda
