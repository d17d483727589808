// The seam to the CUDA half of the engine: devices, libraries, pinned memory. cuda/ implements it
// when nvcc is available; otherwise cpp/core/cuda_absent.cpp does, so the addon builds and loads
// everywhere: on a machine without a GPU, a driver or NVIDIA's libraries, each call reports why
// instead of failing at load time. The layers above have seams of their own: a GPU's Backend
// (ops/backend.h) and the NCCL process group (comm/nccl.h).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/tensor.h"

namespace accordion::cuda {

// Why every call of a seam fails in a build without CUDA.
inline constexpr const char* kNotBuilt = "the addon was built without CUDA (rebuild with nvcc on the PATH)";

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

// A library loaded at run time with dlopen: whether it loaded, its version, and otherwise why not,
// naming every path tried.
struct LibraryStatus {
  bool loaded = false;
  std::string path;     // the file that loaded
  std::string version;  // e.g. "9.10.2"
  std::string error;
};
LibraryStatus cudnnStatus();
LibraryStatus cublasStatus();
LibraryStatus ncclStatus();

// The error a GPU's Backend (cuda::makeBackend, ops/backend.h) would throw for want of a driver, a
// device or a library, or nothing when the device can run a model; then `device` becomes the
// process's GPU, where pinned memory is allocated (see pinnedAllocator). Cheap, and never throws.
std::optional<EngineError> unusable(int device);

// Page-locked host memory that a GPU copies from asynchronously; freed blocks are kept for reuse.
// New blocks are pinned in the context of the process's GPU: the device of the last backend or NCCL
// group made, or of the last device unusable() accepted (GPU 0 before any), set on the calling
// thread first, so that a worker's batch thread creates no context on another worker's GPU.
Allocator& pinnedAllocator();

}  // namespace accordion::cuda
