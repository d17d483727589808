// The precisions values are computed in (--precision) or travel in (--comm-dtype): fp32, or one of
// two 16-bit formats, each rounded to nearest, ties to even, as IEEE 754 and PyTorch's conversions
// round.
//   bf16: fp32's 8-bit exponent, 7 mantissa bits: fp32's range, 2⁻⁸ relative rounding.
//   fp16: 5-bit exponent, 10 mantissa bits: 2⁻¹¹ relative rounding, |x| ≤ 65504 (beyond: ±Inf;
//         below 2⁻¹⁴: subnormal steps of 2⁻²⁴).
// Only what is sent (or multiplied, in bf16 compute) is rounded; sums are taken in fp32.
#pragma once
#include <cstdint>
#include <string>

namespace accordion {

enum class Precision { Fp32, Bf16, Fp16 };

Precision parsePrecision(const std::string& name);
const char* precisionName(Precision p);
// Bytes a value takes on the wire: 4 or 2.
int64_t bytesPerValue(Precision p);

uint16_t toBf16(float x);
float fromBf16(uint16_t h);
uint16_t toFp16(float x);
float fromFp16(uint16_t h);
// A 16-bit precision's encoding and decoding (Bf16 or Fp16).
uint16_t encode(Precision p, float x);
float decode(Precision p, uint16_t h);
// x rounded to `p` and back (x itself for Fp32).
float roundTo(Precision p, float x);

}  // namespace accordion
