// Collectives between the workers of a data-parallel job (the shape of PyTorch's c10d ProcessGroup).
// Every worker calls the same collectives in the same order with the same sizes.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "core/precision.h"

namespace accordion {

// What a rank's collectives have carried, counted by the group where they run, in elements (floats).
// The convention is the one of the floats accounting (docs/accounting.md §1 and §3, per worker):
//   all-reduce of n floats                      n
//   all-gather of n floats per rank             n·W: the gathered result, every rank's part and its
//                                               own included (TopK's 2·s·W is such an all-gather)
//   all-gather of counts[r] floats from rank r  Σ_r counts[r], the same way
//   broadcast of n floats                       n, on the root as on the others
//   barrier                                     no elements (a call is counted)
// A collective that carries nothing (a group of one worker, or zero floats) is not counted at all.
// `bytes` counts the same elements at their size on the wire: 4 for a float, 2 for a value of an
// all-reduce sent in 16 bits (allReduceSumAs).
struct CollectiveCounts {
  int64_t allReduceCalls = 0, allReduceElements = 0;
  int64_t allGatherCalls = 0, allGatherElements = 0;
  int64_t broadcastCalls = 0, broadcastElements = 0;
  int64_t barrierCalls = 0;
  int64_t bytes = 0;
  int64_t elements() const { return allReduceElements + allGatherElements + broadcastElements; }
};

// Bytes one rank sends in a collective among `world` ranks, by the algorithms the groups run: an
// all-reduce of `bytes` (Gloo's ring, two ranks' pair exchange, or the 16-bit all-to-all then
// all-gather of allReduceSumAs) sends 2(W − 1)/W of them; an all-gather of `bytes` per rank sends
// (W − 1)·bytes (a ring forwards every other rank's part once; two ranks swap theirs). A link is
// estimated from these over the collectives' times (the link estimate of the training loop).
double allReduceSentBytes(double bytes, int world);
double allGatherSentBytes(double bytes, int world);

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;
  // Everything this rank's collectives have carried since the group was made (any thread may ask).
  virtual CollectiveCounts counts() const;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Whether the collectives take device memory (NCCL) rather than host memory. Device collectives
  // run after the work already enqueued on the device has finished.
  virtual bool onDevice() const { return false; }
  // Element-wise sum over all workers, in place.
  virtual void allReduceSum(float* data, int64_t count) = 0;
  // The same sum with the values sent in `sent` precision (Fp32: allReduceSum), accumulated in fp32:
  // every rank divides its values by W and rounds them; rank r sums the r-th 1/W share of every
  // rank's values in fp32, in rank order, and rounds that average; the averages are gathered and
  // multiplied by W. Every rank gets the same result; on the wire it is half of allReduceSum's, and
  // it counts as an all-reduce of `count` values of 2 bytes. A value beyond the precision's range
  // (fp16: 65504 once divided by W) comes back as ±Inf. Host memory only (not onDevice()).
  void allReduceSumAs(float* data, int64_t count, Precision sent);
  // allGather with the values sent in `sent` precision (Fp32: allGather): each rank's values are
  // rounded, gathered and widened back to fp32; an all-gather of count·W values of 2 bytes.
  void allGatherAs(const float* input, int64_t count, float* output, Precision sent);
  // Every worker contributes `count` floats; `output` receives size()·count floats in rank order.
  virtual void allGather(const float* input, int64_t count, float* output) = 0;
  // Copies `root`'s data to every worker.
  virtual void broadcast(float* data, int64_t count, int root) = 0;
  virtual void barrier() = 0;

 protected:
  enum class Collective { AllReduce, AllGather, Broadcast, Barrier };
  // Implementations call this once a collective that carried `elements` (by the convention above)
  // has completed; `bytes` defaults to 4 per element.
  void record(Collective kind, int64_t elements, int64_t bytes = -1);
  // Raw exchanges behind allReduceSumAs, not counted; groups that do not implement them refuse it.
  // allToAll: `input` holds size() blocks of `bytes` bytes, block r for rank r; `output` receives
  // rank r's block for this rank at block r. allGatherBytes: every rank's `bytes` in rank order.
  virtual void allToAll(const void* input, size_t bytes, void* output);
  virtual void allGatherBytes(const void* input, size_t bytes, void* output);

 private:
  mutable std::mutex countsMutex_;
  CollectiveCounts counts_;
  // allReduceSumAs's and allGatherAs's 16-bit buffers, kept between calls (one collective at a time).
  std::vector<uint16_t> sending_, receiving_, shares_;
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
    std::vector<const void*> inputs;
    void wait(int size);
  };
  Shared shared_;
  std::vector<std::unique_ptr<ProcessGroup>> members_;
};

}  // namespace accordion
