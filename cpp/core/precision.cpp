#include "core/precision.h"

#include <cmath>
#include <cstring>

#include "core/errors.h"

namespace accordion {

Precision parsePrecision(const std::string& name) {
  if (name == "fp32") return Precision::Fp32;
  if (name == "bf16") return Precision::Bf16;
  if (name == "fp16") return Precision::Fp16;
  throw invalidArgument("unknown communication precision '" + name + "' (known: fp32, bf16, fp16)");
}

const char* precisionName(Precision p) {
  switch (p) {
    case Precision::Bf16: return "bf16";
    case Precision::Fp16: return "fp16";
    default: return "fp32";
  }
}

int64_t bytesPerValue(Precision p) { return p == Precision::Fp32 ? 4 : 2; }

static uint32_t bitsOf(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

static float floatOf(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
}

uint16_t toBf16(float x) {
  const uint32_t b = bitsOf(x);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((b >> 16) | 0x0040u);  // NaN stays a (quiet) NaN
  // Adding 0x7FFF plus the kept part's lowest bit rounds the 16 dropped bits to nearest, ties to
  // even; a carry runs into the exponent (up to Inf), as it should.
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

float fromBf16(uint16_t h) { return floatOf(static_cast<uint32_t>(h) << 16); }

uint16_t toFp16(float x) {
  const uint32_t b = bitsOf(x);
  const uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000u);
  const uint32_t magnitude = b & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return sign | 0x7E00u;      // NaN
  if (magnitude >= 0x477FF000u) return sign | 0x7C00u;     // ≥ 65520 (halfway past 65504, ties to the even Inf) and Inf
  if (magnitude >= 0x38800000u) {                          // normal: ≥ 2⁻¹⁴
    // Round the 13 dropped mantissa bits to nearest even, then move the exponent from fp32's bias
    // (127) to fp16's (15); a carry out of the mantissa raises the exponent, as it should.
    const uint32_t rounded = magnitude + 0x0FFFu + ((magnitude >> 13) & 1u);
    return sign | static_cast<uint16_t>((rounded - (112u << 23)) >> 13);
  }
  // Subnormal: a multiple of 2⁻²⁴. Scaling by 2²⁴ is exact; rint rounds to nearest even (the
  // default rounding mode). 2⁻¹⁴ itself comes out as 0x400, the smallest normal's encoding.
  return sign | static_cast<uint16_t>(std::rint(floatOf(magnitude) * 16777216.0f));
}

float fromFp16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1Fu, mantissa = h & 0x3FFu;
  if (exponent == 0) {  // zero or subnormal: mantissa · 2⁻²⁴, exact in fp32
    const float v = static_cast<float>(mantissa) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exponent == 31) return floatOf(sign | 0x7F800000u | (mantissa << 13));
  return floatOf(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

uint16_t encode(Precision p, float x) { return p == Precision::Fp16 ? toFp16(x) : toBf16(x); }

float decode(Precision p, uint16_t h) { return p == Precision::Fp16 ? fromFp16(h) : fromBf16(h); }

float roundTo(Precision p, float x) { return p == Precision::Fp32 ? x : decode(p, encode(p, x)); }

}  // namespace accordion
