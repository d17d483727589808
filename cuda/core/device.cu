// What the CUDA half was built for and what the driver reports. cudart is linked statically, so
// this loads on machines without a driver: every call reports the runtime's error instead of
// failing at load time. Also each thread's device (core/current_device.h).
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <atomic>

#include "core/cuda.h"
#include "core/current_device.h"

namespace accordion::cuda {

namespace {

thread_local int chosenDevice = -1;  // set through useDevice on this thread, or -1
std::atomic<int> theProcessDevice{0};

// CUDA's version numbers (major·1000 + minor·10) as "13.0".
std::string versionText(int version) { return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10); }

}  // namespace

cudaError_t useDevice(int device) {
  const cudaError_t status = cudaSetDevice(device);
  if (status == cudaSuccess) chosenDevice = device;
  return status;
}

DeviceScope::DeviceScope(int device) : device_(device), previous_(chosenDevice) { useDevice(device); }

DeviceScope::~DeviceScope() {
  if (previous_ >= 0 && previous_ != device_) useDevice(previous_);
}

int processDevice() { return theProcessDevice.load(); }
void setProcessDevice(int device) { theProcessDevice.store(device); }

std::string noDeviceReason(cudaError_t status) {
  dlerror();
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  if (!driver) {
    const char* why = dlerror();
    return std::string("no NVIDIA driver found: ") + (why ? why : "libcuda.so.1 does not load") + " (this build needs a driver for CUDA " +
           versionText(CUDART_VERSION) + " or later)";
  }
  // Asked of the driver directly: it answers without initialising anything.
  using GetVersion = int (*)(int*);
  const auto getVersion = reinterpret_cast<GetVersion>(dlsym(driver, "cuDriverGetVersion"));
  int version = 0;
  const bool known = getVersion && getVersion(&version) == 0;
  dlclose(driver);
  if (known && version < CUDART_VERSION)
    return "the NVIDIA driver (libcuda.so.1) supports CUDA " + versionText(version) + ", older than the CUDA " +
           versionText(CUDART_VERSION) + " this build needs: update the driver";
  return "the CUDA runtime reports '" + std::string(cudaGetErrorString(status)) + "' (error " + std::to_string(static_cast<int>(status)) +
         ")";
}

bool built() { return true; }
std::string compiledArchitectures() { return "sm_80,sm_90"; }
int runtimeVersion() { return CUDART_VERSION; }

DeviceQuery queryDevices() {
  DeviceQuery q;
  cudaError_t status = cudaGetDeviceCount(&q.count);
  if (status != cudaSuccess) {
    q.count = 0;
    q.errorCode = static_cast<int>(status);
    q.error = noDeviceReason(status);
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
