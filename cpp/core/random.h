// Seeded, platform-independent random numbers (xoshiro256**, seeded by splitmix64).
#pragma once
#include <cmath>
#include <cstdint>

namespace accordion {

// SplitMix64's step: its golden-ratio increment, and its finaliser, which makes nearby inputs
// unrelated. Seeds derived from several numbers are finalise(a·kGolden + b + a salt of the use).
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr uint64_t finalise(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Random {
 public:
  explicit Random(uint64_t seed = 0) { reseed(seed); }
  void reseed(uint64_t seed) {
    for (auto& s : state_) s = finalise(seed += kGolden);
    hasSpare_ = false;
  }
  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 24 random bits, exact in float32.
  float uniform() { return static_cast<float>(next() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n).
  uint64_t below(uint64_t n) { return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64); }
  // Standard normal (Box-Muller in double precision).
  float normal() {
    if (hasSpare_) {
      hasSpare_ = false;
      return spare_;
    }
    double u1 = (static_cast<double>(next() >> 11) + 1.0) * (1.0 / 9007199254740992.0);
    double u2 = static_cast<double>(next() >> 11) * (1.0 / 9007199254740992.0);
    double radius = std::sqrt(-2.0 * std::log(u1));
    spare_ = static_cast<float>(radius * std::sin(2.0 * M_PI * u2));
    hasSpare_ = true;
    return static_cast<float>(radius * std::cos(2.0 * M_PI * u2));
  }
  // The whole generator state, so checkpoints can resume a stream exactly.
  struct State {
    uint64_t words[4];
  };
  State state() const { return {{state_[0], state_[1], state_[2], state_[3]}}; }
  void setState(const State& s) {
    for (int i = 0; i < 4; ++i) state_[i] = s.words[i];
    hasSpare_ = false;
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
  float spare_ = 0;
  bool hasSpare_ = false;
};

}  // namespace accordion
