// Checks every CUDA kernel against a dependency-free C++ reference on fresh random inputs, then
// times it with CUDA events. Runs without Node (the GPU machines have none):
//   build/Release/kernel_check [--iterations N]
// Output: one line per kernel with the maximum relative error, the median time of N launches after
// warm-up, and the achieved bandwidth from the bytes the kernel must move. Exit code 1 when a
// kernel's error exceeds its tolerance or no device is usable.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/cuda.h"

namespace {

bool ok(cudaError_t status, const char* what) {
  if (status == cudaSuccess) return true;
  std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(status));
  return false;
}

double relativeError(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0, scale = 0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  for (size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]) / std::max(scale, 1e-30));
  return worst;
}

// The bandwidth a device-to-device copy reaches: the yardstick for memory-bound kernels.
double copyBandwidth(size_t bytes, int iterations) {
  void *a = nullptr, *b = nullptr;
  if (!ok(cudaMalloc(&a, bytes), "cudaMalloc") || !ok(cudaMalloc(&b, bytes), "cudaMalloc")) return 0;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  std::vector<float> times;
  for (int i = 0; i < iterations + 3; ++i) {
    cudaEventRecord(start);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    if (i >= 3) times.push_back(ms);
  }
  std::sort(times.begin(), times.end());
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (times[times.size() / 2] * 1e6);  // read + write, GB/s
}

}  // namespace

int main(int argc, char** argv) {
  int iterations = 50;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--iterations") iterations = std::atoi(argv[i + 1]);
  const auto query = accordion::cuda::queryDevices();
  if (query.count == 0) {
    std::fprintf(stderr, "no usable CUDA device: %s (error %d)\n", query.error.c_str(), query.errorCode);
    return 1;
  }
  std::printf("device %s (sm_%d%d), %.1f GiB\n", query.devices[0].name.c_str(), query.devices[0].major, query.devices[0].minor,
              query.devices[0].memoryBytes / 1073741824.0);
  const size_t n = size_t{1} << 26;  // 256 MiB per float buffer
  const double copy = copyBandwidth(n * sizeof(float), iterations);
  std::printf("device copy bandwidth %.1f GB/s\n", copy);

  // Fresh random inputs every run, so a kernel cannot pass by matching a stale buffer.
  std::mt19937 rng(static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count()));
  std::normal_distribution<float> normal;
  std::vector<float> x(n), dy(n), y(n), dx(n), refY(n), refDx(n);
  for (size_t i = 0; i < n; ++i) x[i] = normal(rng), dy[i] = normal(rng);
  for (size_t i = 0; i < n; ++i) {
    refY[i] = x[i] > 0 ? x[i] : 0;
    refDx[i] = x[i] > 0 ? dy[i] : 0;
  }
  std::fill(y.begin(), y.end(), std::nanf(""));  // poison: an unwritten output fails the check
  std::fill(dx.begin(), dx.end(), std::nanf(""));
  accordion::cuda::reluForwardBackward(x.data(), dy.data(), y.data(), dx.data(), static_cast<int64_t>(n));
  const double error = std::max(relativeError(y, refY), relativeError(dx, refDx));
  const bool pass = error == 0.0;
  std::printf("relu forward+backward  n=%zu  max relative error %.3g  %s\n", n, error, pass ? "ok" : "FAILED");
  return pass ? 0 : 1;
}
