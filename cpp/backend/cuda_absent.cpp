// CPU-only builds: the CUDA seam reports that nothing was built.
#include "backend/cuda.h"

#include "errors.h"

namespace accordion::cuda {

bool built() { return false; }
std::string compiledArchitectures() { return ""; }
int runtimeVersion() { return 0; }

DeviceQuery queryDevices() {
  DeviceQuery q;
  q.error = "the addon was built without CUDA";
  return q;
}

std::string ncclStatus() { return "the addon was built without CUDA, so without NCCL"; }

void reluForwardBackward(const float*, const float*, float*, float*, int64_t) {
  throw EngineError("ERR_NO_CUDA", "the addon was built without CUDA (rebuild with nvcc on the PATH)");
}

}  // namespace accordion::cuda
