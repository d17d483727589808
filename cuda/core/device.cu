// What the CUDA half was built for and what the driver reports. cudart is linked statically, so
// this loads on machines without a driver: every call reports the runtime's error instead of
// failing at load time.
#include <cuda_runtime.h>

#include "core/cuda.h"

namespace accordion::cuda {

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

}  // namespace accordion::cuda
