// ProcessGroup over NCCL (device pointers), built when nvcc is available. See nccl_group.cu.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "comm/process_group.h"
#include "comm/store_client.h"

namespace accordion::cuda {

// Empty when libnccl.so.2 loads, else why not.
std::string ncclStatus();

class NcclGroup : public ProcessGroup {
 public:
  // Rank 0 creates the unique id and publishes it in the store; the others read it.
  NcclGroup(StoreClient& store, int rank, int size, int device, std::chrono::milliseconds timeout, const std::string& prefix);
  ~NcclGroup() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allReduceSum(float* deviceData, int64_t count) override;
  void allGather(const float* deviceInput, int64_t count, float* deviceOutput) override;
  void broadcast(float* deviceData, int64_t count, int root) override;
  void barrier() override;

 private:
  void wait(const std::string& what);
  struct Impl;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace accordion::cuda
