// A ProcessGroup for device memory over a group of host memory: each collective copies its buffer to
// the host, runs there and copies the result back (how c10d's Gloo serves CUDA tensors). It lets the
// in-process workers of the reducer's tests and benchmarks run on a GPU; training on GPUs uses NCCL.
#pragma once
#include <vector>

#include "comm/process_group.h"
#include "ops/backend.h"

namespace accordion {

class StagedGroup : public ProcessGroup {
 public:
  StagedGroup(ProcessGroup& host, Backend& backend) : host_(host), backend_(backend) {}
  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  bool onDevice() const override { return true; }
  void allReduceSum(float* data, int64_t count) override;
  void allGather(const float* input, int64_t count, float* output) override;
  void broadcast(float* data, int64_t count, int root) override;
  void barrier() override { host_.barrier(); }
  // The host group carries every collective, and counts it.
  CollectiveCounts counts() const override { return host_.counts(); }

 private:
  // The device buffer's contents in host_, after the work enqueued so far.
  float* toHost(const float* data, int64_t count, std::vector<float>& host);
  ProcessGroup& host_;
  Backend& backend_;
  std::vector<float> in_, out_;
};

}  // namespace accordion
