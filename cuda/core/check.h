// Error checks and launch shapes shared by the CUDA sources.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/errors.h"

namespace accordion::cuda {

// Throws EngineError ERR_CUDA naming the call and the runtime's error.
inline void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess)
    throw EngineError("ERR_CUDA", std::string(what) + " failed: " + cudaGetErrorString(status) + " (CUDA error " +
                                      std::to_string(static_cast<int>(status)) + ")");
}

// After a kernel launch: a bad configuration shows here; faults in the kernel show at the next wait.
inline void checkLaunch(const char* kernel) { check(cudaGetLastError(), kernel); }

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements: enough to fill the device several times over,
// never more than the work needs.
inline int blocksFor(int64_t n, int threads = kThreads) {
  const int64_t needed = (n + threads - 1) / threads;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(needed, 4096)));
}

}  // namespace accordion::cuda
