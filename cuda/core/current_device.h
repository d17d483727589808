// Which GPU a thread works on, and why the driver is missing.
//
// The CUDA runtime gives every thread a current device, GPU 0 until the thread sets another, and
// creates that device's context (hundreds of MiB of GPU memory) at the thread's first call. So a
// worker on GPU 1 whose batch thread pins host memory, or whose last reference to device memory is
// dropped on a thread that never chose a device, would create a context on GPU 0, which another
// worker owns. Every call that allocates pinned memory, frees device memory or destroys a stream
// sets its device first, through these.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>

namespace accordion::cuda {

// cudaSetDevice(device) on the calling thread, remembered for DeviceScope.
cudaError_t useDevice(int device);

// `device` is current for the scope. At its end a thread that had chosen a device through useDevice
// gets it back; a thread that had not keeps `device` (going back to the default would itself create
// a context on GPU 0).
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int device_, previous_;
};

// The GPU this process works on: the device of the last backend or NCCL communicator made, or the
// last device a device check accepted (a job checks its worker's GPU before it assembles batches);
// GPU 0 before any. Pinned host memory is allocated in its context.
int processDevice();
void setProcessDevice(int device);

// `bytes` of pinned host memory from the cache of pinnedAllocator(), pinned (when new) in the
// context of `device` rather than the process's GPU: for a backend's own staging copies.
std::shared_ptr<void> pinnedOn(int device, size_t bytes);

// Why the runtime found no device, for a failed cudaGetDeviceCount: "no NVIDIA driver found" when
// libcuda.so.1 does not load, the driver's CUDA version when it is older than this build's runtime,
// else the runtime's own description of `status`.
std::string noDeviceReason(cudaError_t status);

}  // namespace accordion::cuda
