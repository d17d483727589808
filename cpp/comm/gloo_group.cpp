#include "comm/gloo_group.h"

#include <gloo/allgather.h>
#include <gloo/allgatherv.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "comm/gloo_mesh.h"
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
    StoreAdapter adapter(store_);
    gloo::rendezvous::PrefixStore prefixed("gloo/" + o.prefix, adapter);
    context_ = connectMesh({o.rank, o.size, o.hostname, o.timeout}, prefixed);
  } catch (const EngineError&) {
    throw;
  } catch (const std::exception& e) {
    throw EngineError("ERR_RENDEZVOUS", "rank " + std::to_string(o.rank) + " could not connect to the other " +
                                            std::to_string(o.size - 1) + " worker(s) through Gloo (bound to " + o.hostname +
                                            "): " + e.what());
  }
  if (size_ > 1) {
    // A few heartbeats per timeout, at most one a second: one small write to the store each.
    interval_ = std::clamp(timeout_ / 10, std::chrono::milliseconds(50), std::chrono::milliseconds(1000));
    watch_ = std::make_shared<StoreClient>(o.storeHost, o.storePort, o.token, o.timeout, 2 * interval_ + std::chrono::milliseconds(200));
    beat();
    heartbeat_ = std::thread([this] {
      std::unique_lock<std::mutex> lock(beatMutex_);
      while (!beatWake_.wait_for(lock, interval_, [this] { return stopping_; })) {
        lock.unlock();
        try {
          beat();
        } catch (const std::exception&) {
          // The store is gone: the job is ending, or a collective will say why.
        }
        lock.lock();
      }
    });
  }
}

GlooGroup::~GlooGroup() {
  {
    std::lock_guard<std::mutex> lock(beatMutex_);
    stopping_ = true;
  }
  beatWake_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

std::string GlooGroup::aliveKey(int rank) const { return "gloo/" + options_.prefix + "/alive/" + std::to_string(rank); }

// The record is two u64: heartbeats so far, and collectives entered.
void GlooGroup::beat() {
  const uint64_t record[2] = {++beats_, entered_.load()};
  std::vector<char> value(sizeof(record));
  std::memcpy(value.data(), record, sizeof(record));
  watch_->set(aliveKey(rank_), value);
}

std::string GlooGroup::unresponsive(uint64_t entered) {
  if (!watch_) return "";
  auto read = [&](int r, uint64_t out[2]) {
    std::vector<char> v = watch_->get(aliveKey(r), std::chrono::milliseconds(0));
    if (v.size() != 2 * sizeof(uint64_t)) return false;
    std::memcpy(out, v.data(), v.size());
    return true;
  };
  std::vector<uint64_t> first(2 * size_), second(2 * size_);
  std::vector<bool> seen(size_, false);
  try {
    for (int r = 0; r < size_; ++r)
      if (r != rank_) seen[r] = read(r, &first[2 * r]);
    // Three heartbeat intervals: a live rank beats at least twice meanwhile.
    std::this_thread::sleep_for(3 * interval_);
    for (int r = 0; r < size_; ++r)
      if (r != rank_ && seen[r]) seen[r] = read(r, &second[2 * r]);
  } catch (const std::exception&) {
    // The store is out of reach too: whether the others stopped or only cannot be reached cannot be told.
    std::string others;
    for (int r = 0; r < size_; ++r)
      if (r != rank_) others += (others.empty() ? "" : ", ") + std::to_string(r);
    return (size_ == 2 ? "rank " + others + " did not answer and the rendezvous store does not answer either"
                       : "the rendezvous store does not answer either, so which of ranks " + others + " did not answer cannot be told") +
           std::string(": this rank is cut off from the others (a network partition?) or the job is ending (the store is hosted by the "
                       "launcher, or by rank 0 without one)");
  }
  std::vector<std::string> stopped, behind;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (!seen[r] || second[2 * r] == first[2 * r]) {
      stopped.push_back(std::to_string(r));
    } else if (second[2 * r + 1] < entered) {
      behind.push_back("rank " + std::to_string(r) + " (at collective " + std::to_string(second[2 * r + 1]) + ")");
    }
  }
  auto join = [](const std::vector<std::string>& items) {
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + items[i];
    return out;
  };
  std::string out;
  if (!stopped.empty())
    out = (stopped.size() == 1 ? "rank " + stopped[0] + " does" : "ranks " + join(stopped) + " do") + " not answer (no heartbeat for " +
          std::to_string((3 * interval_).count()) + " ms: stopped, frozen or dead)";
  if (!behind.empty())
    out += (out.empty() ? "" : "; ") + join(behind) + (behind.size() == 1 ? " is" : " are") + " alive but did not reach collective " +
           std::to_string(entered);
  if (out.empty()) out = "every other rank is alive and reached this collective (a network problem?)";
  return out;
}

template <typename Fn>
void GlooGroup::guarded(const std::string& what, Fn&& fn) {
  const uint64_t entered = ++entered_;
  try {
    fn();
  } catch (const std::exception& e) {
    const std::string blame = unresponsive(entered);
    throw EngineError("ERR_COLLECTIVE", what + " failed on rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                                            (blame.empty() ? "" : ": " + blame) + " (timeout " + std::to_string(timeout_.count()) +
                                            " ms; " + e.what() + ")");
  }
}

// Gloo moves a message only once the receiver has announced its receive, and that notice travels
// behind the bulk data already queued on the link: with Gloo's two segments in flight a slow link
// idles between them (its all-gather of two ranks reaches ~63% of a 100 Mbit/s link, its all-reduce
// ~88%). Two ranks instead announce every segment's receive first, then send them all (~92%).
template <typename Fn>
void GlooGroup::pairExchange(const void* send, void* receive, size_t bytes, Fn&& received) {
  const int peer = 1 - rank_;
  auto out = context_->createUnboundBuffer(const_cast<void*>(send), bytes);
  auto in = context_->createUnboundBuffer(receive, bytes);
  const uint64_t slot = gloo::Slot::build(kPairSlotPrefix, tag_++);
  const size_t segments = (bytes + kPairSegmentBytes - 1) / kPairSegmentBytes;
  auto length = [&](size_t k) { return std::min(kPairSegmentBytes, bytes - k * kPairSegmentBytes); };
  for (size_t k = 0; k < segments; ++k) in->recv(peer, slot, k * kPairSegmentBytes, length(k));
  for (size_t k = 0; k < segments; ++k) out->send(peer, slot, k * kPairSegmentBytes, length(k));
  // Segments complete in order on the pair's one connection; a timeout or a lost peer throws.
  for (size_t k = 0; k < segments; ++k) {
    in->waitRecv(timeout_);
    out->waitSend(timeout_);
    received(k * kPairSegmentBytes, length(k));
  }
}

void GlooGroup::allReduceSum(float* data, int64_t count) {
  if (size_ == 1 || count == 0) return;
  if (size_ == 2) {
    guarded("all-reduce of " + std::to_string(count) + " floats", [&] {
      if (pairScratch_.size() < static_cast<size_t>(count)) pairScratch_.resize(static_cast<size_t>(count));
      const float* theirs = pairScratch_.data();
      // A segment is summed once it has arrived and this rank's copy of it has left. a + b is b + a
      // in floating point, so both ranks hold the same sums, as with Gloo's ring.
      pairExchange(data, pairScratch_.data(), count * sizeof(float), [&](size_t first, size_t n) {
        for (size_t i = first / sizeof(float); i < (first + n) / sizeof(float); ++i) data[i] += theirs[i];
      });
    });
    record(Collective::AllReduce, count);
    return;
  }
  guarded("all-reduce of " + std::to_string(count) + " floats", [&] {
    gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, static_cast<size_t>(count));
    opts.setReduceFunction(static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    gloo::allreduce(opts);
  });
  record(Collective::AllReduce, count);
}

void GlooGroup::allGather(const float* input, int64_t count, float* output) {
  if (count == 0) return;
  if (size_ == 1) {
    std::copy(input, input + count, output);
    return;
  }
  if (size_ == 2) {
    guarded("all-gather of " + std::to_string(count) + " floats per rank", [&] {
      std::copy(input, input + count, output + rank_ * count);
      pairExchange(input, output + (1 - rank_) * count, count * sizeof(float), [](size_t, size_t) {});
    });
    record(Collective::AllGather, count * size_);
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
  record(Collective::AllGather, count * size_);
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
  record(Collective::AllGather, total);
}

void GlooGroup::allToAll(const void* input, size_t bytes, void* output) {
  auto block = [bytes](auto* base, int r) { return base + static_cast<size_t>(r) * bytes; };
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  guarded("all-to-all of " + std::to_string(bytes) + " bytes per rank pair", [&] {
    if (size_ == 2) {
      std::memcpy(block(out, rank_), block(in, rank_), bytes);
      pairExchange(block(in, 1 - rank_), block(out, 1 - rank_), bytes, [](size_t, size_t) {});
      return;
    }
    gloo::AlltoallOptions opts(context_);
    opts.setInput(const_cast<uint8_t*>(in), bytes * size_);
    opts.setOutput(out, bytes * size_);
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    gloo::alltoall(opts);
  });
}

void GlooGroup::allGatherBytes(const void* input, size_t bytes, void* output) {
  auto* out = static_cast<uint8_t*>(output);
  guarded("all-gather of " + std::to_string(bytes) + " bytes per rank", [&] {
    std::memcpy(out + rank_ * bytes, input, bytes);
    if (size_ == 2) {
      pairExchange(input, out + (1 - rank_) * bytes, bytes, [](size_t, size_t) {});
      return;
    }
    gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<uint8_t*>(const_cast<void*>(input)), bytes);
    opts.setOutput(out, bytes * size_);
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    gloo::allgather(opts);
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
  record(Collective::Broadcast, count);
}

void GlooGroup::barrier() {
  if (size_ == 1) return;
  guarded("barrier", [&] {
    gloo::BarrierOptions opts(context_);
    opts.setTag(tag_++);
    opts.setTimeout(timeout_);
    gloo::barrier(opts);
  });
  record(Collective::Barrier, 0);
}

}  // namespace accordion
