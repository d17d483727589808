// The kernel lab's inputs: random numbers reproducible from a seed on any number of cores, and the
// shapes and sizes the checks draw (activations, element counts, parameter lists).
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "core/random.h"

namespace accordion::lab {

struct Skipped : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Runs body(i) for every i in [0, count) on all cores (drawing large inputs on one would take seconds).
inline void parallelFor(int64_t count, const std::function<void(int64_t)>& body) {
  const int64_t threads = std::min<int64_t>(count, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  auto work = [&] {
    for (int64_t i = next++; i < count; i = next++) body(i);
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
}

inline uint64_t mix(uint64_t x) { return finalise(x + kGolden); }  // nearby seeds give unrelated generators

// The inputs of one run, reproducible from its seed. Each draw is cut into chunks of a fixed size,
// each from its own generator seeded by (seed, draw, chunk), so the numbers do not depend on how
// many cores draw them.
class RandomInputs {
 public:
  explicit RandomInputs(uint64_t seed, int64_t maxElements = 0) : seed_(seed), maxElements_(maxElements) {}

  std::vector<float> normal(int64_t n, float mean = 0.0f, float stddev = 1.0f) {
    return draw<float>(n, std::normal_distribution<float>(mean, stddev));
  }
  // Variances: |N(0, 1)| + 0.5.
  std::vector<float> positive(int64_t n) {
    std::vector<float> v = normal(n);
    for (float& x : v) x = std::fabs(x) + 0.5f;
    return v;
  }
  std::vector<uint8_t> bernoulli(int64_t n, double p) { return draw<uint8_t>(n, std::bernoulli_distribution(p)); }
  std::vector<int32_t> labels(int64_t n, int32_t classes) {
    return draw<int32_t>(n, std::uniform_int_distribution<int32_t>(0, classes - 1));
  }
  int64_t index(int64_t n) { return draw<int64_t>(1, std::uniform_int_distribution<int64_t>(0, n - 1))[0]; }
  float scalar() { return normal(1)[0]; }
  // A 64-bit key (a dropout mask's).
  uint64_t key() { return mix(seed_ ^ mix(++draws_)); }

 private:
  static constexpr int64_t kChunk = int64_t{1} << 20;

  template <typename T, typename Distribution>
  std::vector<T> draw(int64_t n, const Distribution& distribution) {
    if (maxElements_ > 0 && n > maxElements_)  // before drawing: large draws take seconds
      throw Skipped(std::to_string(n) + " elements, beyond --max-elements " + std::to_string(maxElements_));
    std::vector<T> out(static_cast<size_t>(n));
    const uint64_t stream = mix(seed_ ^ mix(++draws_));
    parallelFor((n + kChunk - 1) / kChunk, [&](int64_t chunk) {
      std::mt19937_64 engine(mix(stream + static_cast<uint64_t>(chunk)));
      Distribution d = distribution;
      const int64_t end = std::min(n, (chunk + 1) * kChunk);
      for (int64_t i = chunk * kChunk; i < end; ++i) out[static_cast<size_t>(i)] = static_cast<T>(d(engine));
    });
    return out;
  }

  uint64_t seed_, draws_ = 0;
  int64_t maxElements_;
};

// ---- Shapes --------------------------------------------------------------------------------------

struct Dims {  // an activation (N, C, H, W)
  int64_t n, c, h, w;
  int64_t numel() const { return n * c * h * w; }
  std::string label() const {
    return "(" + std::to_string(n) + "," + std::to_string(c) + "," + std::to_string(h) + "," + std::to_string(w) + ")";
  }
};

// Element counts: single elements, counts that are not multiples of 4 (the tails of vectorised
// loops), primes, a ResNet-18 activation at batch 128, and 64 Mi floats (256 MiB, far beyond the
// H100's 50 MB L2) for bandwidth.
const std::vector<int64_t> kElementCounts = {1, 3, 4, 997, 65537, 128 * 64 * 32 * 32, int64_t{64} << 20};

inline std::string countLabel(int64_t n) { return "n=" + std::to_string(n); }

// The parameters of CIFAR ResNet-18 (models/models.cpp) in order: 62 tensors, 11,173,962 floats.
inline std::vector<int64_t> resnet18ParameterSizes() {
  std::vector<int64_t> sizes = {64 * 3 * 3 * 3};
  auto batchNorm = [&](int64_t channels) { sizes.insert(sizes.end(), {channels, channels}); };
  batchNorm(64);
  int64_t in = 64;
  for (int64_t planes : {64, 128, 256, 512})
    for (int block = 0; block < 2; ++block) {
      sizes.push_back(planes * in * 9);
      batchNorm(planes);
      sizes.push_back(planes * planes * 9);
      batchNorm(planes);
      if (in != planes) {  // the 1×1 shortcut of a stage's first block
        sizes.push_back(planes * in);
        batchNorm(planes);
      }
      in = planes;
    }
  sizes.insert(sizes.end(), {10 * 512, 10});
  return sizes;
}

// The lists the per-parameter ops take: odd sizes, a real model's, and one tensor beyond L2.
struct TensorList {
  std::string label;
  std::vector<int64_t> sizes;
  int64_t total() const { return std::accumulate(sizes.begin(), sizes.end(), int64_t{0}); }
};

inline std::vector<TensorList> tensorLists() {
  return {{"sizes 1,3,997,4,65537", {1, 3, 997, 4, 65537}},
          {"ResNet-18 parameters (62 tensors, 11.2M)", resnet18ParameterSizes()},
          {"one tensor of 64Mi", {int64_t{64} << 20}}};
}


}  // namespace accordion::lab
