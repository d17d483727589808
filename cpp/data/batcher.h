// Assembles training batches on a background thread: shuffles with DistributedSampler semantics,
// augments (random crop with zero padding, horizontal flip) and normalises CIFAR images into float
// tensors in the layout of the model's device, a few batches ahead of the consumer. For a GPU the
// batches are in pinned host memory, which the device copies from asynchronously.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

#include <exception>
#include <functional>

#include "core/tensor.h"

namespace accordion {

struct BatcherOptions {
  int64_t batchSize = 0;  // given by the caller (the option table's --batch-size)
  bool shuffle = true;
  bool augment = true;  // random crop (padding below) and horizontal flip
  int64_t padding = 4;
  bool dropLast = false;
  uint64_t seed = 0;
  int64_t rank = 0, worldSize = 1;  // this worker's shard
  // DistributedSampler pads the index list to a multiple of the world size (every rank gets as many
  // samples); evaluation shards without padding so each sample counts once.
  bool padShards = true;
  float mean[3] = {0.f, 0.f, 0.f};  // per channel, on the [0, 1] scale
  float stddev[3] = {1.f, 1.f, 1.f};
  int64_t prefetch = 3;  // batches prepared ahead
  // The layout and memory the consuming model's device wants: channels-last in pageable memory for
  // the CPU, channels-first in pinned memory for a GPU.
  bool channelsLast = true;
  bool pinned = false;
};

class Backend;

struct Batch {
  Tensor images;          // (N, 3, 32, 32) normalised, channels-last or channels-first
  Array<int32_t> labels;  // (N,), or a token window's T·B targets
  bool channelsLast = true;
  // A language model's (T, B) window of token ids in host memory, in place of images (T = steps).
  const int32_t* tokens = nullptr;
  int64_t steps = 0;
  int64_t size() const { return labels.size(); }
  // A copy on a device, attached ahead of time by the backend that will consume the batch.
  Tensor deviceImages;
  Array<int32_t> deviceLabels;
  const Backend* stagedBy = nullptr;
};

class Batcher {
 public:
  static constexpr int64_t kChannels = 3, kHeight = 32, kWidth = 32, kImageBytes = kChannels * kHeight * kWidth;

  // `images` holds count × 3072 bytes (CIFAR's planar RGB), `labels` count entries in [0, classes).
  // Both must outlive the batcher. Pinned batches need CUDA (core/cuda.h).
  Batcher(const uint8_t* images, const int32_t* labels, int64_t count, int64_t classes, BatcherOptions options);
  ~Batcher();
  Batcher(const Batcher&) = delete;
  Batcher& operator=(const Batcher&) = delete;

  void startEpoch(int64_t epoch);
  // Blocks until the next batch of the current epoch is ready; false once the epoch is exhausted.
  bool next(Batch& out);
  // Blocks until the batch that next() will return is ready and lets `amend` change it (attach a
  // device copy) in place; false once the epoch is exhausted.
  bool withNext(const std::function<void(Batch&)>& amend);
  int64_t batchesPerEpoch() const;
  int64_t samplesPerEpoch() const { return shardSize_; }
  const BatcherOptions& options() const { return options_; }

 private:
  void produce();
  void assemble(int64_t epoch, int64_t batchIndex, const std::vector<int64_t>& order, Batch& out) const;

  const uint8_t* images_;
  const int32_t* labels_;
  int64_t count_;
  BatcherOptions options_;
  int64_t shardSize_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::thread thread_;
  bool stopping_ = false;
  uint64_t generation_ = 0;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;      // this rank's sample indices for the epoch
  int64_t nextToProduce_ = 0, nextToConsume_ = 0;
  std::deque<Batch> ready_;
  std::exception_ptr failure_;  // from the producer thread, rethrown by next()
};

}  // namespace accordion
