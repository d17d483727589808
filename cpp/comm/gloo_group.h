// ProcessGroup over Gloo's TCP transport: one process per worker, connected in a full mesh whose
// addresses are exchanged through the job's rendezvous store. Every collective has a timeout and
// failures surface as EngineError ERR_COLLECTIVE naming the operation and this rank.
#pragma once
#include <chrono>
#include <memory>
#include <string>

#include "comm/process_group.h"
#include "comm/store_client.h"

namespace gloo {
class Context;
}

namespace accordion {

struct GlooOptions {
  int rank = 0, size = 1;
  std::string storeHost = "127.0.0.1";
  int storePort = 29500;
  std::string token;
  // The address other workers reach this one at (the interface used to reach the store).
  std::string hostname = "127.0.0.1";
  std::chrono::milliseconds timeout{60000};
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

 private:
  template <typename Fn>
  void guarded(const std::string& what, Fn&& fn);
  GlooOptions options_;
  int rank_, size_;
  std::chrono::milliseconds timeout_;
  uint32_t tag_ = 0;
  std::shared_ptr<StoreClient> store_;
  std::shared_ptr<gloo::Context> context_;
};

}  // namespace accordion
