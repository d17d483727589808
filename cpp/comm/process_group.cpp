#include "comm/process_group.h"

#include <algorithm>
#include <cstring>

#include "core/errors.h"

namespace accordion {

double allReduceSentBytes(double bytes, int world) { return world > 1 ? bytes * 2.0 * (world - 1) / world : 0.0; }
double allGatherSentBytes(double bytes, int world) { return world > 1 ? bytes * (world - 1) : 0.0; }

CollectiveCounts ProcessGroup::counts() const {
  std::lock_guard<std::mutex> lock(countsMutex_);
  return counts_;
}

void ProcessGroup::record(Collective kind, int64_t elements, int64_t bytes) {
  std::lock_guard<std::mutex> lock(countsMutex_);
  counts_.bytes += bytes < 0 ? elements * static_cast<int64_t>(sizeof(float)) : bytes;
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

static EngineError fp32Only() {
  return invalidArgument("this process group sends fp32 only (values in 16 bits travel over Gloo and the in-process groups)");
}

void ProcessGroup::allToAll(const void*, size_t, void*) { throw fp32Only(); }

static void requireHost(const ProcessGroup& group, Precision sent) {
  if (group.onDevice()) throw invalidArgument(std::string("values sent in ") + precisionName(sent) + " need host memory; this group's are on a device");
}

void ProcessGroup::allGatherBytes(const void*, size_t, void*) { throw fp32Only(); }

void ProcessGroup::allReduceSumAs(float* data, int64_t count, Precision sent) {
  if (sent == Precision::Fp32) return allReduceSum(data, count);
  const int world = size();
  if (world == 1 || count == 0) return;
  requireHost(*this, sent);
  const int64_t share = (count + world - 1) / world;  // values per rank's share; the last is padded with zeros
  const float inverse = 1.0f / static_cast<float>(world);
  sending_.resize(static_cast<size_t>(share * world));
  receiving_.resize(sending_.size());
  shares_.resize(static_cast<size_t>(share));
  for (int64_t i = 0; i < count; ++i) sending_[i] = encode(sent, data[i] * inverse);
  std::fill(sending_.begin() + count, sending_.end(), uint16_t{0});
  allToAll(sending_.data(), share * sizeof(uint16_t), receiving_.data());
  for (int64_t j = 0; j < share; ++j) {
    float sum = 0.0f;
    for (int r = 0; r < world; ++r) sum += decode(sent, receiving_[r * share + j]);
    shares_[j] = encode(sent, sum);
  }
  allGatherBytes(shares_.data(), share * sizeof(uint16_t), sending_.data());
  for (int64_t i = 0; i < count; ++i) data[i] = decode(sent, sending_[i]) * static_cast<float>(world);
  record(Collective::AllReduce, count, count * bytesPerValue(sent));
}

void ProcessGroup::allGatherAs(const float* input, int64_t count, float* output, Precision sent) {
  if (sent == Precision::Fp32 || size() == 1) return allGather(input, count, output);
  if (count == 0) return;
  requireHost(*this, sent);
  const int world = size();
  sending_.resize(static_cast<size_t>(count));
  receiving_.resize(static_cast<size_t>(count * world));
  for (int64_t i = 0; i < count; ++i) sending_[i] = encode(sent, input[i]);
  allGatherBytes(sending_.data(), count * sizeof(uint16_t), receiving_.data());
  for (int64_t i = 0; i < count * world; ++i) output[i] = decode(sent, receiving_[i]);
  record(Collective::AllGather, count * world, count * world * bytesPerValue(sent));
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
      for (int64_t i = 0; i < count; ++i) sum[i] += inputOf(r)[i];
    shared_.wait(size_);  // everyone has read every input before anyone overwrites its own
    std::copy(sum.begin(), sum.end(), data);
    shared_.wait(size_);
    if (size_ > 1 && count > 0) record(Collective::AllReduce, count);
  }

  void allGather(const float* input, int64_t count, float* output) override {
    publish(input);
    for (int r = 0; r < size_; ++r) std::copy(inputOf(r), inputOf(r) + count, output + r * count);
    shared_.wait(size_);
    if (size_ > 1 && count > 0) record(Collective::AllGather, count * size_);
  }

  void broadcast(float* data, int64_t count, int root) override {
    publish(data);
    std::vector<float> copy(inputOf(root), inputOf(root) + count);
    shared_.wait(size_);
    std::copy(copy.begin(), copy.end(), data);
    shared_.wait(size_);
    if (size_ > 1 && count > 0) record(Collective::Broadcast, count);
  }

  void barrier() override {
    shared_.wait(size_);
    if (size_ > 1) record(Collective::Barrier, 0);
  }

 protected:
  void allToAll(const void* in, size_t bytes, void* out) override {
    publish(in);
    for (int r = 0; r < size_; ++r)
      std::memcpy(static_cast<char*>(out) + r * bytes, static_cast<const char*>(shared_.inputs[r]) + rank_ * bytes, bytes);
    shared_.wait(size_);
  }

  void allGatherBytes(const void* in, size_t bytes, void* out) override {
    publish(in);
    for (int r = 0; r < size_; ++r) std::memcpy(static_cast<char*>(out) + r * bytes, shared_.inputs[r], bytes);
    shared_.wait(size_);
  }

 private:
  const float* inputOf(int rank) const { return static_cast<const float*>(shared_.inputs[rank]); }
  // Makes this rank's buffer visible and waits until every rank's is.
  void publish(const void* data) {
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
