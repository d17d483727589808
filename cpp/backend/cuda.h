// The seam to the CUDA backend. cuda/*.cu implements it when nvcc is available; otherwise
// cpp/backend/cuda_absent.cpp does, so the addon builds and loads everywhere.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace accordion::cuda {

struct DeviceInfo {
  std::string name;
  int major = 0, minor = 0;  // compute capability
  uint64_t memoryBytes = 0;
};

struct DeviceQuery {
  int count = 0;
  int errorCode = 0;   // the CUDA runtime's error code when the query failed (e.g. no driver), else 0
  std::string error;   // its description
  std::vector<DeviceInfo> devices;
};

bool built();
std::string compiledArchitectures();  // e.g. "sm_80,sm_90", empty when not built
int runtimeVersion();                 // CUDART_VERSION the addon was built with, 0 when not built
DeviceQuery queryDevices();           // never throws
// Empty when NCCL (libnccl.so.2, loaded with dlopen) is usable, else why not.
std::string ncclStatus();

// Element-wise ReLU on device 0: y = max(x, 0) and dx = dy·[y > 0], host buffers in and out.
// Throws EngineError when CUDA is not built or no device is usable.
void reluForwardBackward(const float* x, const float* dy, float* y, float* dx, int64_t n);

}  // namespace accordion::cuda
