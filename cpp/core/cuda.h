// The seam to the CUDA half of the engine. cuda/ implements it when nvcc is available; otherwise
// cpp/core/cuda_absent.cpp does, so the addon builds and loads everywhere: on a machine without a
// GPU, a driver or NVIDIA's libraries, each call reports why instead of failing at load time.
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/errors.h"
#include "core/tensor.h"

namespace accordion {
class Backend;
class ProcessGroup;
class StoreClient;
}

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

// The ops of device `device` for one model: its own stream, cuDNN and cuBLAS handles and memory
// pool. Throws EngineError naming the cause when the device or the libraries are not usable:
// ERR_NO_CUDA (not built), ERR_NO_CUDA_DEVICE (no driver or no such device), ERR_CUDA_LIBRARY
// (cuDNN or cuBLAS not found, with the paths tried).
std::unique_ptr<Backend> makeBackend(int device);
// The error makeBackend(device) would throw for want of a driver, a device or a library, or nothing
// when the device can run a model; then `device` becomes the process's GPU, where pinned memory is
// allocated (see pinnedAllocator). Cheap, and never throws.
std::optional<EngineError> unusable(int device);

// A ProcessGroup over NCCL for GPU memory, one GPU per process (cuda/comm/nccl_group.h). The ranks
// meet through `store`; throws EngineError naming the cause (ERR_NO_CUDA, ERR_CUDA_LIBRARY,
// ERR_NO_CUDA_DEVICE, ERR_COLLECTIVE for a set-up that fails or outlasts the timeout).
struct NcclOptions {
  int rank = 0, size = 1;
  int device = 0;                            // the GPU of this rank (LOCAL_RANK)
  std::chrono::milliseconds timeout{60000};  // bounds the set-up and every collective
  std::string prefix = "default";            // namespaces this communicator's keys in the store
  std::string hostname;                      // names this rank's host in errors
};
std::shared_ptr<ProcessGroup> makeNcclGroup(StoreClient& store, const NcclOptions& options);

// Page-locked host memory that a GPU copies from asynchronously; freed blocks are kept for reuse.
// New blocks are pinned in the context of the process's GPU: the device of the last backend or NCCL
// group made, or of the last device unusable() accepted (GPU 0 before any), set on the calling
// thread first, so that a worker's batch thread creates no context on another worker's GPU.
Allocator& pinnedAllocator();

}  // namespace accordion::cuda
