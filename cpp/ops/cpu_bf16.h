// bf16 compute on the CPU (--precision bf16). Convolutions and matrix products run oneDNN's bf16
// primitives where the CPU multiplies bf16 itself (AVX512-BF16, AMX); elsewhere the
// engine rounds the products' inputs to bf16 and multiplies them in fp32, which gives the same
// products (a bf16 product is exact in fp32) summed in another order, at about fp32's speed.
#pragma once
#include <cstdint>

namespace accordion {

enum class Bf16Compute { Native, Rounded };

// How this CPU computes in bf16.
Bf16Compute cpuBf16Compute();
// The CPU features behind it, in words ("avx512_core_bf16", "avx512_core_amx", "avx2").
const char* cpuIsaName();

// y[i] = x[i] rounded to bf16 (nearest, ties to even), as a float; y may be x. A subnormal x[i]
// becomes a zero of its sign, as the bf16 instructions read their inputs, so that a product takes
// the same values on every CPU.
void roundToBf16(const float* x, float* y, int64_t n);
// y[i] = x[i] rounded to bf16, as its 16-bit encoding.
void encodeBf16(const float* x, uint16_t* y, int64_t n);

}  // namespace accordion
