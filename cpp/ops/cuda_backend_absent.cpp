// CPU-only builds: a GPU's Backend reports that nothing was built.
#include "core/cuda.h"
#include "ops/backend.h"

namespace accordion::cuda {

std::unique_ptr<Backend> makeBackend(int) { throw EngineError("ERR_NO_CUDA", kNotBuilt); }

}  // namespace accordion::cuda
