// ProcessGroup over Gloo's TCP transport: one process per worker, connected in a full mesh whose
// addresses are exchanged through the job's rendezvous store. Every collective has a timeout and
// failures surface as EngineError ERR_COLLECTIVE naming the operation, this rank and the ranks that
// did not answer: a thread of every rank publishes in the store, a few times per timeout, a
// heartbeat and the number of collectives the rank has entered; a rank whose collective fails
// reads them to tell a rank that stopped (no heartbeat) from one that is alive but behind.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "comm/process_group.h"
#include "comm/store_client.h"

namespace gloo {
class Context;
}

namespace accordion {

// Every field is given by the binding (cpp/napi/process_group.cpp), whose caller's defaults are the
// TypeScript layer's (the store's address and port, the option table's timeout).
struct GlooOptions {
  int rank = 0, size = 1;
  std::string storeHost;
  int storePort = 0;
  std::string token;
  // The address other workers reach this one at (the interface used to reach the store).
  std::string hostname;
  std::chrono::milliseconds timeout{0};
  std::string prefix = "default";  // namespaces the keys of one group in the store
};

class GlooGroup : public ProcessGroup {
 public:
  explicit GlooGroup(const GlooOptions& options);
  ~GlooGroup() override;
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void allReduceSum(float* data, int64_t count) override;
  void allGather(const float* input, int64_t count, float* output) override;
  // Unequal sizes: `counts[r]` floats from rank r, concatenated in rank order into `output`.
  void allGatherV(const float* input, const std::vector<int64_t>& counts, float* output);
  void broadcast(float* data, int64_t count, int root) override;
  void barrier() override;
  // What the group was created with, and the job's store it met through (where a GPU communicator
  // of the same workers meets too).
  const GlooOptions& options() const { return options_; }
  StoreClient& store() { return *store_; }

 protected:
  void allToAll(const void* input, size_t bytes, void* output) override;
  void allGatherBytes(const void* input, size_t bytes, void* output) override;

 private:
  template <typename Fn>
  void guarded(const std::string& what, Fn&& fn);
  std::string aliveKey(int rank) const;
  // Two ranks: sends `bytes` to the other rank while receiving as many, in segments; received(first,
  // n) runs for each segment (its offset and length in bytes) once it has arrived and its sent twin
  // has left.
  template <typename Fn>
  void pairExchange(const void* send, void* receive, size_t bytes, Fn&& received);
  static constexpr uint8_t kPairSlotPrefix = 0x7e;
  static constexpr size_t kPairSegmentBytes = size_t{4} << 20;
  void beat();
  // Which ranks did not answer in the collective numbered `entered`, in words.
  std::string unresponsive(uint64_t entered);
  GlooOptions options_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  uint32_t tag_ = 0;
  std::vector<float> pairScratch_;  // two ranks: the other's gradients, as large as the largest all-reduce
  std::shared_ptr<StoreClient> store_;
  std::shared_ptr<gloo::Context> context_;
  // Heartbeat: its own connection to the store, so that it never waits behind a blocking get.
  std::chrono::milliseconds interval_;
  std::shared_ptr<StoreClient> watch_;
  std::atomic<uint64_t> entered_{0};
  uint64_t beats_ = 0;  // only the heartbeat thread (and the constructor before it starts) counts
  std::mutex beatMutex_;
  std::condition_variable beatWake_;
  bool stopping_ = false;
  std::thread heartbeat_;
};

}  // namespace accordion
