#include "comm/process_group.h"

#include <algorithm>
#include <cstring>

namespace accordion {

CollectiveCounts ProcessGroup::counts() const {
  std::lock_guard<std::mutex> lock(countsMutex_);
  return counts_;
}

void ProcessGroup::record(Collective kind, int64_t elements) {
  std::lock_guard<std::mutex> lock(countsMutex_);
  switch (kind) {
    case Collective::AllReduce:
      counts_.allReduceCalls += 1;
      counts_.allReduceElements += elements;
      break;
    case Collective::AllGather:
      counts_.allGatherCalls += 1;
      counts_.allGatherElements += elements;
      break;
    case Collective::Broadcast:
      counts_.broadcastCalls += 1;
      counts_.broadcastElements += elements;
      break;
    case Collective::Barrier:
      counts_.barrierCalls += 1;
      break;
  }
}

void LocalGroup::allGather(const float* input, int64_t count, float* output) {
  if (count && input != output) std::memcpy(output, input, count * sizeof(float));
}

void InProcessGroup::Shared::wait(int size) {
  std::unique_lock<std::mutex> lock(mutex);
  const uint64_t gen = generation;
  if (++waiting == size) {
    waiting = 0;
    ++generation;
    arrived.notify_all();
  } else {
    arrived.wait(lock, [&] { return generation != gen; });
  }
}

class InProcessGroup::Member : public ProcessGroup {
 public:
  Member(Shared& shared, int rank, int size) : shared_(shared), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allReduceSum(float* data, int64_t count) override {
    publish(data);
    std::vector<float> sum(count, 0.0f);
    for (int r = 0; r < size_; ++r)
      for (int64_t i = 0; i < count; ++i) sum[i] += shared_.inputs[r][i];
    shared_.wait(size_);  // everyone has read every input before anyone overwrites its own
    std::copy(sum.begin(), sum.end(), data);
    shared_.wait(size_);
    if (size_ > 1 && count > 0) record(Collective::AllReduce, count);
  }

  void allGather(const float* input, int64_t count, float* output) override {
    publish(input);
    for (int r = 0; r < size_; ++r) std::copy(shared_.inputs[r], shared_.inputs[r] + count, output + r * count);
    shared_.wait(size_);
    if (size_ > 1 && count > 0) record(Collective::AllGather, count * size_);
  }

  void broadcast(float* data, int64_t count, int root) override {
    publish(data);
    std::vector<float> copy(shared_.inputs[root], shared_.inputs[root] + count);
    shared_.wait(size_);
    std::copy(copy.begin(), copy.end(), data);
    shared_.wait(size_);
    if (size_ > 1 && count > 0) record(Collective::Broadcast, count);
  }

  void barrier() override {
    shared_.wait(size_);
    if (size_ > 1) record(Collective::Barrier, 0);
  }

 private:
  // Makes this rank's buffer visible and waits until every rank's is.
  void publish(const float* data) {
    {
      std::lock_guard<std::mutex> lock(shared_.mutex);
      if (shared_.inputs.size() != static_cast<size_t>(size_)) shared_.inputs.assign(size_, nullptr);
      shared_.inputs[rank_] = data;
    }
    shared_.wait(size_);
  }
  Shared& shared_;
  int rank_, size_;
};

InProcessGroup::InProcessGroup(int size) {
  for (int r = 0; r < size; ++r) members_.push_back(std::make_unique<Member>(shared_, r, size));
}

}  // namespace accordion
