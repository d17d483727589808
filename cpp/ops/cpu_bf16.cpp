#include "ops/cpu_bf16.h"

#include <cstring>

#include <oneapi/dnnl/dnnl.hpp>

#include "core/precision.h"
#include "ops/bf16_rounding.h"

namespace accordion {

namespace {

bool hasIsa(dnnl::cpu_isa isa) {
  const auto effective = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  return (effective & static_cast<unsigned>(isa)) == static_cast<unsigned>(isa);
}

// x rounded to bf16 as a float (ops/bf16_rounding.h).
float roundedToBf16(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  const uint32_t r = bf16RoundedBits(b);
  float y;
  std::memcpy(&y, &r, sizeof(y));
  return y;
}

}  // namespace

Bf16Compute cpuBf16Compute() { return hasIsa(dnnl::cpu_isa::avx512_core_bf16) ? Bf16Compute::Native : Bf16Compute::Rounded; }

const char* cpuIsaName() {
  if (hasIsa(dnnl::cpu_isa::avx512_core_amx)) return "avx512_core_amx";
  if (hasIsa(dnnl::cpu_isa::avx512_core_bf16)) return "avx512_core_bf16";
  if (hasIsa(dnnl::cpu_isa::avx512_core)) return "avx512_core";
  if (hasIsa(dnnl::cpu_isa::avx2)) return "avx2";
  return "sse4.1 or older";
}

void roundToBf16(const float* x, float* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) y[i] = roundedToBf16(x[i]);
}

void encodeBf16(const float* x, uint16_t* y, int64_t n) {
#pragma omp parallel for schedule(static) if (n > 32768)
  for (int64_t i = 0; i < n; ++i) y[i] = toBf16(x[i]);
}

}  // namespace accordion
