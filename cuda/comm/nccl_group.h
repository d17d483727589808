// ProcessGroup over NCCL: the collectives of a data-parallel job on GPU memory, one GPU per process.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "comm/process_group.h"
#include "comm/store_client.h"
#include "comm/nccl.h"
#include "core/cuda.h"

namespace accordion::cuda {

class NcclGroup : public ProcessGroup {
 public:
  // Rank 0 creates the unique id and publishes it in the store; the others read it. Before NCCL is
  // asked, the ranks compare their GPUs through the store, so two ranks on one GPU (which NCCL
  // refuses) fail on every rank with an error naming both.
  NcclGroup(StoreClient& store, const NcclOptions& options);
  ~NcclGroup() override;
  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  bool onDevice() const override { return true; }
  void allReduceSum(float* deviceData, int64_t count) override;
  void allGather(const float* deviceInput, int64_t count, float* deviceOutput) override;
  void broadcast(float* deviceData, int64_t count, int root) override;
  void barrier() override;

 private:
  // Waits for the operation with the group's timeout: first for NCCL to have enqueued it (the
  // communicator is non-blocking), then for the stream. A failed or hung peer aborts the
  // communicator and throws ERR_COLLECTIVE naming `what` and this rank.
  void wait(const std::string& what);
  [[noreturn]] void abort(const std::string& message);
  // Finalises the communicator (bounded by the timeout), then destroys it; aborts it when that fails.
  void finalizeAndDestroy() noexcept;
  // The communicator, unless an earlier failure aborted it.
  struct ncclComm* live(const std::string& what);
  void enqueued(int result, const std::string& what);
  NcclOptions options_;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace accordion::cuda
