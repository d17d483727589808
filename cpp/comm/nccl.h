// The seam to NCCL: a ProcessGroup over GPU memory, one GPU per process. cuda/comm/nccl_group.cu
// implements it when nvcc is available; otherwise cpp/comm/nccl_absent.cpp says it was not built.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "comm/process_group.h"
#include "comm/store_client.h"

namespace accordion::cuda {

// The ranks meet through `store`; throws EngineError naming the cause (ERR_NO_CUDA, ERR_CUDA_LIBRARY,
// ERR_NO_CUDA_DEVICE, ERR_COLLECTIVE for a set-up that fails or outlasts the timeout).
struct NcclOptions {
  int rank = 0, size = 1;
  int device = 0;                            // the GPU of this rank (LOCAL_RANK)
  std::chrono::milliseconds timeout{0};  // bounds the set-up and every collective: the Gloo group's
  std::string prefix = "default";            // namespaces this communicator's keys in the store
  std::string hostname;                      // names this rank's host in errors
};
std::shared_ptr<ProcessGroup> makeNcclGroup(StoreClient& store, const NcclOptions& options);

}  // namespace accordion::cuda
