// CPU-only builds: the CUDA seam reports that nothing was built.
#include "core/cuda.h"

namespace accordion::cuda {

namespace {

LibraryStatus notBuilt() {
  LibraryStatus s;
  s.error = kNotBuilt;
  return s;
}

}  // namespace

bool built() { return false; }
std::string compiledArchitectures() { return ""; }
int runtimeVersion() { return 0; }

DeviceQuery queryDevices() {
  DeviceQuery q;
  q.error = kNotBuilt;
  return q;
}

LibraryStatus cudnnStatus() { return notBuilt(); }
LibraryStatus cublasStatus() { return notBuilt(); }
LibraryStatus ncclStatus() {
  LibraryStatus s;
  s.error = std::string("no NCCL: ") + kNotBuilt;
  return s;
}

std::optional<EngineError> unusable(int) { return EngineError("ERR_NO_CUDA", kNotBuilt); }

Allocator& pinnedAllocator() { throw EngineError("ERR_NO_CUDA", std::string("pinned memory: ") + kNotBuilt); }

}  // namespace accordion::cuda
