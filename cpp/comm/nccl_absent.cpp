// CPU-only builds: the NCCL seam reports that nothing was built.
#include "comm/nccl.h"

#include "core/cuda.h"

namespace accordion::cuda {

std::shared_ptr<ProcessGroup> makeNcclGroup(StoreClient&, const NcclOptions&) { throw EngineError("ERR_NO_CUDA", kNotBuilt); }

}  // namespace accordion::cuda
