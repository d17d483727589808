#include "data/batcher.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "core/cuda.h"
#include "core/random.h"

namespace accordion {

static uint64_t mixSeed(uint64_t a, uint64_t b) { return finalise(a * kGolden + b + 0x632BE59BD9B4E019ull); }

Batcher::Batcher(const uint8_t* images, const int32_t* labels, int64_t count, int64_t classes, BatcherOptions options)
    : images_(images), labels_(labels), count_(count), options_(options) {
  if (count <= 0) throw invalidArgument("a batcher needs at least one sample");
  if (options.batchSize <= 0) throw invalidArgument("batch size must be positive, got " + std::to_string(options.batchSize));
  if (options.worldSize <= 0 || options.rank < 0 || options.rank >= options.worldSize)
    throw invalidArgument("rank " + std::to_string(options.rank) + " is outside a world of " + std::to_string(options.worldSize));
  for (int64_t i = 0; i < count; ++i)
    if (labels[i] < 0 || labels[i] >= classes)
      throw invalidArgument("label " + std::to_string(labels[i]) + " of sample " + std::to_string(i) + " is outside 0.." +
                            std::to_string(classes - 1));
  // DistributedSampler: pad the index list to a multiple of the world size, each rank takes every W-th.
  shardSize_ = options.padShards ? (count + options.worldSize - 1) / options.worldSize
                                 : (count - options.rank + options.worldSize - 1) / options.worldSize;
  // Pinned memory comes from the CUDA runtime: find out now, on the caller's thread, if it cannot.
  if (options.pinned) cuda::pinnedAllocator().allocate(1);
  thread_ = std::thread([this] { produce(); });
}

Batcher::~Batcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

int64_t Batcher::batchesPerEpoch() const {
  return options_.dropLast ? shardSize_ / options_.batchSize : (shardSize_ + options_.batchSize - 1) / options_.batchSize;
}

void Batcher::startEpoch(int64_t epoch) {
  std::vector<int64_t> all(count_);
  std::iota(all.begin(), all.end(), int64_t{0});
  if (options_.shuffle) {
    Random rng(mixSeed(options_.seed, static_cast<uint64_t>(epoch)));
    for (int64_t i = count_ - 1; i > 0; --i) std::swap(all[i], all[rng.below(static_cast<uint64_t>(i + 1))]);
  }
  const int64_t total = options_.padShards ? shardSize_ * options_.worldSize : count_;
  for (int64_t i = count_; i < total; ++i) all.push_back(all[i - count_]);
  std::vector<int64_t> shard;
  shard.reserve(shardSize_);
  for (int64_t i = options_.rank; i < total; i += options_.worldSize) shard.push_back(all[i]);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++generation_;
    epoch_ = epoch;
    order_ = std::move(shard);
    nextToProduce_ = nextToConsume_ = 0;
    ready_.clear();
  }
  changed_.notify_all();
}

bool Batcher::next(Batch& out) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (epoch_ < 0) throw invalidArgument("Batcher::next called before startEpoch");
  if (nextToConsume_ >= batchesPerEpoch()) return false;
  changed_.wait(lock, [&] { return !ready_.empty() || failure_; });
  if (failure_) std::rethrow_exception(failure_);
  out = std::move(ready_.front());
  ready_.pop_front();
  ++nextToConsume_;
  changed_.notify_all();
  return true;
}

bool Batcher::withNext(const std::function<void(Batch&)>& amend) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (epoch_ < 0 || nextToConsume_ >= batchesPerEpoch()) return false;
  changed_.wait(lock, [&] { return !ready_.empty() || failure_; });
  if (failure_) std::rethrow_exception(failure_);
  amend(ready_.front());
  return true;
}

void Batcher::produce() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] {
      return stopping_ || (epoch_ >= 0 && nextToProduce_ < batchesPerEpoch() &&
                           static_cast<int64_t>(ready_.size()) < options_.prefetch);
    });
    if (stopping_) return;
    const uint64_t generation = generation_;
    const int64_t epoch = epoch_, index = nextToProduce_++;
    const std::vector<int64_t> order = order_;  // a copy: startEpoch may replace it meanwhile
    lock.unlock();
    Batch batch;
    try {
      assemble(epoch, index, order, batch);
    } catch (...) {
      lock.lock();
      failure_ = std::current_exception();
      changed_.notify_all();
      return;
    }
    lock.lock();
    if (generation == generation_) {
      ready_.push_back(std::move(batch));
      changed_.notify_all();
    }
  }
}

void Batcher::assemble(int64_t epoch, int64_t batchIndex, const std::vector<int64_t>& order, Batch& out) const {
  const int64_t begin = batchIndex * options_.batchSize;
  const int64_t n = std::min(options_.batchSize, static_cast<int64_t>(order.size()) - begin);
  Allocator& memory = options_.pinned ? cuda::pinnedAllocator() : hostAllocator();
  out.images = Tensor({n, kChannels, kHeight, kWidth}, memory);
  out.labels = Array<int32_t>(n, memory);
  out.channelsLast = options_.channelsLast;
  // Where channel c of pixel (y, x) goes: (y·W + x)·C + c channels-last, c·H·W + y·W + x channels-first.
  const int64_t pixelStride = options_.channelsLast ? kChannels : 1, channelStride = options_.channelsLast ? 1 : kHeight * kWidth;
  float scale[3], shift[3];  // value = pixel·scale + shift = (pixel/255 − mean)/std
  for (int c = 0; c < 3; ++c) {
    scale[c] = 1.0f / (255.0f * options_.stddev[c]);
    shift[c] = -options_.mean[c] / options_.stddev[c];
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t sample = order[begin + i];
    out.labels[i] = labels_[sample];
    const uint8_t* src = images_ + sample * kImageBytes;
    float* dst = out.images.data() + i * kImageBytes;
    int64_t dy = 0, dx = 0;
    bool flip = false;
    if (options_.augment) {
      // One stream per (epoch, position) keeps augmentation independent of thread timing.
      Random rng(mixSeed(mixSeed(options_.seed ^ 0xA5A5A5A5ull, static_cast<uint64_t>(epoch)),
                         static_cast<uint64_t>(begin + i) * 131 + static_cast<uint64_t>(options_.rank)));
      dy = static_cast<int64_t>(rng.below(2 * options_.padding + 1)) - options_.padding;
      dx = static_cast<int64_t>(rng.below(2 * options_.padding + 1)) - options_.padding;
      flip = rng.uniform() < 0.5f;
    }
    for (int64_t y = 0; y < kHeight; ++y) {
      const int64_t sy = y + dy;
      for (int64_t x = 0; x < kWidth; ++x) {
        const int64_t cropX = flip ? kWidth - 1 - x : x;  // flip after cropping, as torchvision's pipeline does
        const int64_t sx = cropX + dx;
        const bool inside = sy >= 0 && sy < kHeight && sx >= 0 && sx < kWidth;
        float* px = dst + (y * kWidth + x) * pixelStride;
        for (int64_t c = 0; c < kChannels; ++c) {
          const float raw = inside ? static_cast<float>(src[c * kHeight * kWidth + sy * kWidth + sx]) : 0.0f;
          px[c * channelStride] = raw * scale[c] + shift[c];
        }
      }
    }
  }
}

}  // namespace accordion
