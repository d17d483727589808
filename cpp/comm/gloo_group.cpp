#include "comm/gloo_group.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "core/errors.h"

namespace accordion {

namespace {

// Gloo's rendezvous interface over the job's store.
class StoreAdapter : public gloo::rendezvous::Store {
 public:
  explicit StoreAdapter(std::shared_ptr<StoreClient> client) : client_(std::move(client)) {}
  void set(const std::string& key, const std::vector<char>& data) override { client_->set(key, data); }
  std::vector<char> get(const std::string& key) override { return client_->get(key, client_->timeout()); }
  void wait(const std::vector<std::string>& keys) override { wait(keys, client_->timeout()); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    for (const auto& key : keys) client_->get(key, timeout);
  }

 private:
  std::shared_ptr<StoreClient> client_;
};

}  // namespace

GlooGroup::GlooGroup(const GlooOptions& o) : options_(o), rank_(o.rank), size_(o.size), timeout_(o.timeout) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size)
    throw invalidArgument("rank " + std::to_string(o.rank) + " is outside a world of size " + std::to_string(o.size));
  store_ = std::make_shared<StoreClient>(o.storeHost, o.storePort, o.token, o.timeout);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = o.hostname;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    context->setTimeout(o.timeout);
    StoreAdapter adapter(store_);
    gloo::rendezvous::PrefixStore prefixed("gloo/" + o.prefix, adapter);
    context->connectFullMesh(prefixed, device);
    context_ = context;
  } catch (const EngineError&) {
    throw;
  } catch (const std::exception& e) {
    throw EngineError("ERR_RENDEZVOUS", "rank " + std::to_string(o.rank) + " could not connect to the other " +
                                            std::to_string(o.size - 1) + " worker(s) through Gloo (bound to " + o.hostname +
                                            "): " + e.what());
  }
}

GlooGroup::~GlooGroup() = default;

template <typename Fn>
void GlooGroup::guarded(const std::string& what, Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    throw EngineError("ERR_COLLECTIVE", what + " failed on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                                            " (timeout " + std::to_string(timeout_.count()) + " ms): " + e.what());
  }
}

void GlooGroup::allReduceSum(float* data, int64_t count) {
  if (size_ == 1 || count == 0) return;
  guarded("all-reduce of " + std::to_string(count) + " floats", [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, static_cast<size_t>(count));
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  });
}

void GlooGroup::allGather(const float* input, int64_t count, float* output) {
  if (count == 0) return;
  if (size_ == 1) {
    std::copy(input, input + count, output);
    return;
  }
  guarded("all-gather of " + std::to_string(count) + " floats per rank", [&] {
    gloo::AllgatherOptions opts(context_);
    opts.setInput(const_cast<float*>(input), static_cast<size_t>(count));
    opts.setOutput(output, static_cast<size_t>(count * size_));
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
  });
}

void GlooGroup::allGatherV(const float* input, const std::vector<int64_t>& counts, float* output) {
  if (static_cast<int>(counts.size()) != size_)
    throw invalidArgument("all-gather needs one count per rank, got " + std::to_string(counts.size()));
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0) return;
  if (size_ == 1) {
    std::copy(input, input + counts[0], output);
    return;
  }
  guarded("all-gather of " + std::to_string(total) + " floats in all", [&] {
    gloo::AllgathervOptions opts(context_);
    opts.setInput(const_cast<float*>(input), static_cast<size_t>(counts[rank_]));
    opts.setOutput(output, std::vector<size_t>(counts.begin(), counts.end()));
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    gloo::allgatherv(opts);
  });
}

void GlooGroup::broadcast(float* data, int64_t count, int root) {
  if (root < 0 || root >= size_) throw invalidArgument("broadcast root " + std::to_string(root) + " is not a rank");
  if (size_ == 1 || count == 0) return;
  guarded("broadcast of " + std::to_string(count) + " floats from rank " + std::to_string(root), [&] {
    gloo::BroadcastOptions opts(context_);
    opts.setOutput(data, static_cast<size_t>(count));
    opts.setRoot(root);
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    gloo::broadcast(opts);
  });
}

void GlooGroup::barrier() {
  if (size_ == 1) return;
  guarded("barrier", [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
}

}  // namespace accordion
