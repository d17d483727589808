// Dropout's keep mask as a function of a key and an element's index, so that a device draws it
// where it is used, with no host draw and no upload, and every device draws the same mask: element
// i is kept when the i-th output of SplitMix64 from state `key` (finalise(key + (i + 1)·kGolden)),
// its 24 high bits read as a uniform in [0, 1), is at least p. The model's generator gives one key
// per mask (its state is what a checkpoint keeps).
#pragma once
#include <cstdint>

#include "core/host_device.h"
#include "core/random.h"

namespace accordion {

ACCORDION_HOST_DEVICE inline uint8_t dropoutKeeps(uint64_t key, int64_t i, float p) {
  const uint64_t bits = finalise(key + static_cast<uint64_t>(i + 1) * kGolden);
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f) >= p;
}

}  // namespace accordion
