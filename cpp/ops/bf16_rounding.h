// The rounding of bf16 compute (--precision bf16) on every device: fp32 bits to the bf16 bits the
// CPU's bf16 instructions give, to nearest, ties to even, a NaN kept a quiet NaN, a subnormal read as
// a zero of its sign. Branch-free, so that the compiler vectorises it on the CPU.
#pragma once
#include <cstdint>

#include "core/host_device.h"

namespace accordion {

// The 32-bit pattern of the rounded value (its low 16 bits zero): bf16's bits are its high half.
ACCORDION_HOST_DEVICE inline uint32_t bf16RoundedBits(uint32_t b) {
  const uint32_t magnitude = b & 0x7FFFFFFFu;
  uint32_t r = (b + 0x7FFFu + ((b >> 16) & 1u)) & 0xFFFF0000u;
  r = magnitude > 0x7F800000u ? (b | 0x00400000u) & 0xFFFF0000u : r;
  r = magnitude < 0x00800000u ? b & 0x80000000u : r;
  return r;
}

}  // namespace accordion
