// The part of NCCL's API the engine uses, declared here with the ABI of NCCL 2.14 and later (nccl.h)
// and bound with dlopen at first use: no NCCL headers or link-time dependency. cuda/lab/abi_check.cu
// checks these declarations against the real header.
#pragma once
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>

#include "core/cuda.h"

struct ncclComm;  // NCCL's opaque communicator, declared at global scope as in nccl.h

namespace accordion::cuda::nccl {

using Comm = struct ncclComm*;
using Result = int;  // ncclResult_t

constexpr Result kSuccess = 0, kInProgress = 7;  // ncclSuccess, ncclInProgress
constexpr int kFloat32 = 7;                      // ncclFloat32
constexpr int kSum = 0;                          // ncclSum

struct UniqueId {
  char internal[128];
};

// ncclConfig_t as NCCL 2.14 introduced it (NCCL_CONFIG_INITIALIZER): later versions read the fields
// that `size` and `version` say are present and default the rest.
struct Config {
  size_t size = sizeof(Config);
  unsigned int magic = 0xcafebeef;
  unsigned int version = 21400;  // NCCL_VERSION(2, 14, 0)
  int blocking = INT_MIN;        // NCCL_CONFIG_UNDEF_INT: NCCL's default
  int cgaClusterSize = INT_MIN, minCTAs = INT_MIN, maxCTAs = INT_MIN;
  const char* netName = nullptr;
};

struct Api {
  Result (*getVersion)(int*);
  const char* (*getErrorString)(Result);
  Result (*getUniqueId)(UniqueId*);
  Result (*commInitRankConfig)(Comm*, int nranks, UniqueId, int rank, Config*);
  // Flushes what is still queued; on a non-blocking communicator it returns ncclInProgress and
  // ncclCommGetAsyncError reports when it is done. Before ncclCommDestroy (NCCL 2.14 and later).
  Result (*commFinalize)(Comm);
  Result (*commDestroy)(Comm);
  Result (*commAbort)(Comm);
  Result (*commGetAsyncError)(Comm, Result*);
  Result (*allReduce)(const void*, void*, size_t, int datatype, int op, Comm, cudaStream_t);
  Result (*allGather)(const void*, void*, size_t, int datatype, Comm, cudaStream_t);
  Result (*broadcast)(const void*, void*, size_t, int datatype, int root, Comm, cudaStream_t);
};

// The loaded API; throws EngineError ERR_CUDA_LIBRARY, naming every path tried, when NCCL is missing.
const Api& api();
LibraryStatus status();

}  // namespace accordion::cuda::nccl
