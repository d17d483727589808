// CPU-only builds: the CUDA seam reports that nothing was built.
#include "core/cuda.h"

#include "ops/backend.h"

namespace accordion::cuda {

namespace {

const char* kNotBuilt = "the addon was built without CUDA (rebuild with nvcc on the PATH)";

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

std::unique_ptr<Backend> makeBackend(int) { throw EngineError("ERR_NO_CUDA", kNotBuilt); }
std::optional<EngineError> unusable(int) { return EngineError("ERR_NO_CUDA", kNotBuilt); }

std::shared_ptr<ProcessGroup> makeNcclGroup(StoreClient&, const NcclOptions&) { throw EngineError("ERR_NO_CUDA", kNotBuilt); }

Allocator& pinnedAllocator() { throw EngineError("ERR_NO_CUDA", std::string("pinned memory: ") + kNotBuilt); }

}  // namespace accordion::cuda
