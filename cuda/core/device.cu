// Device discovery and the first kernel pair (ReLU forward/backward) of the CUDA backend.
// cudart is linked statically, so this loads on machines without a driver: every call reports the
// runtime's error instead of failing at load time.
#include <cuda_runtime.h>

#include <string>

#include "core/cuda.h"
#include "core/errors.h"

namespace accordion::cuda {

namespace {

__global__ void reluForwardKernel(const float* x, float* y, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

// Same contract as the CPU ReLU: the mask comes from the forward output.
__global__ void reluBackwardKernel(const float* y, const float* dy, float* dx, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw EngineError("ERR_CUDA", std::string(what) + " failed: " + cudaGetErrorString(status) + " (CUDA error " +
                                      std::to_string(static_cast<int>(status)) + ")");
}

// Device memory released on every path, including exceptions.
struct DeviceBuffer {
  float* ptr = nullptr;
  explicit DeviceBuffer(int64_t n) { check(cudaMalloc(&ptr, static_cast<size_t>(n) * sizeof(float)), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(ptr); }
};

}  // namespace

bool built() { return true; }
std::string compiledArchitectures() { return "sm_80,sm_90"; }
int runtimeVersion() { return CUDART_VERSION; }

DeviceQuery queryDevices() {
  DeviceQuery q;
  cudaError_t status = cudaGetDeviceCount(&q.count);
  if (status != cudaSuccess) {
    q.count = 0;
    q.errorCode = static_cast<int>(status);
    q.error = cudaGetErrorString(status);
    cudaGetLastError();  // clear the sticky error so later queries start clean
    return q;
  }
  for (int d = 0; d < q.count; ++d) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, d) != cudaSuccess) continue;
    q.devices.push_back({prop.name, prop.major, prop.minor, static_cast<uint64_t>(prop.totalGlobalMem)});
  }
  return q;
}

void reluForwardBackward(const float* x, const float* dy, float* y, float* dx, int64_t n) {
  if (n <= 0) return;
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count == 0) throw EngineError("ERR_NO_CUDA_DEVICE", "no CUDA device found");
  check(cudaSetDevice(0), "cudaSetDevice");
  const size_t bytes = static_cast<size_t>(n) * sizeof(float);
  DeviceBuffer dX(n), dY(n), dDy(n), dDx(n);
  check(cudaMemcpy(dX.ptr, x, bytes, cudaMemcpyHostToDevice), "copy x to the device");
  check(cudaMemcpy(dDy.ptr, dy, bytes, cudaMemcpyHostToDevice), "copy dy to the device");
  const int threads = 256;
  const int blocks = static_cast<int>(std::min<int64_t>((n + threads - 1) / threads, 65535));
  reluForwardKernel<<<blocks, threads>>>(dX.ptr, dY.ptr, n);
  reluBackwardKernel<<<blocks, threads>>>(dY.ptr, dDy.ptr, dDx.ptr, n);
  check(cudaGetLastError(), "ReLU kernel launch");
  check(cudaMemcpy(y, dY.ptr, bytes, cudaMemcpyDeviceToHost), "copy y to the host");
  check(cudaMemcpy(dx, dDx.ptr, bytes, cudaMemcpyDeviceToHost), "copy dx to the host");
}

}  // namespace accordion::cuda
