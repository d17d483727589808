// Collectives between the workers of a data-parallel job (the shape of PyTorch's c10d ProcessGroup).
// Every worker calls the same collectives in the same order with the same sizes.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

namespace accordion {

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether the collectives take device memory (NCCL) rather than host memory. Device collectives
  // run after the work already enqueued on the device has finished.
  virtual bool onDevice() const { return false; }
  // Element-wise sum over all workers, in place.
  virtual void allReduceSum(float* data, int64_t count) = 0;
  // Every worker contributes `count` floats; `output` receives size()·count floats in rank order.
  virtual void allGather(const float* input, int64_t count, float* output) = 0;
  // Copies `root`'s data to every worker.
  virtual void broadcast(float* data, int64_t count, int root) = 0;
  virtual void barrier() = 0;
};

// The group of a single process: every collective is the identity.
class LocalGroup : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void allReduceSum(float*, int64_t) override {}
  void allGather(const float* input, int64_t count, float* output) override;
  void broadcast(float*, int64_t, int) override {}
  void barrier() override {}
};

// W workers as threads of one process, for testing the multi-worker arithmetic of the compressors.
// Sums are taken in rank order, so every worker gets bit-identical results, as with a real backend.
class InProcessGroup {
 public:
  explicit InProcessGroup(int size);
  // The ProcessGroup seen by one worker thread.
  ProcessGroup& member(int rank) { return *members_.at(rank); }
  int size() const { return static_cast<int>(members_.size()); }

 private:
  class Member;
  struct Shared {
    std::mutex mutex;
    std::condition_variable arrived;
    int waiting = 0;
    uint64_t generation = 0;
    std::vector<const float*> inputs;
    void wait(int size);
  };
  Shared shared_;
  std::vector<std::unique_ptr<ProcessGroup>> members_;
};

}  // namespace accordion
