// The CPU backend's memory operations, and the backend factory.
#include "ops/cpu_backend.h"

#include <algorithm>
#include <cstring>

#include "ops/cpu_compression_kernels.h"
#include "core/cuda.h"

namespace accordion {

CpuBackend::CpuBackend() : compression_(std::make_unique<CpuCompressionKernels>()) {}
CpuBackend::~CpuBackend() = default;

void CpuBackend::upload(void* dst, const void* hostSrc, size_t bytes) {
  if (bytes) std::memcpy(dst, hostSrc, bytes);
}

void CpuBackend::download(void* hostDst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(hostDst, src, bytes);
}

void CpuBackend::copy(void* dst, const void* src, size_t bytes) {
  if (bytes && dst != src) std::memcpy(dst, src, bytes);
}

void CpuBackend::fill(float* data, int64_t n, float value) { std::fill(data, data + n, value); }

std::shared_ptr<void> CpuBackend::uploadAhead(const void* hostSrc, size_t bytes, std::shared_ptr<const void>) {
  std::shared_ptr<void> copy = allocate(bytes);
  upload(copy.get(), hostSrc, bytes);
  return copy;
}

void CpuBackend::uploadImages(const float* hostNchw, float* images, int64_t n, int64_t c, int64_t h, int64_t w) {
  nchwToNhwc(hostNchw, images, n, c, h, w);
}

void nchwToNhwc(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t hw = h * w;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) dst[(b * hw + p) * c + ch] = src[(b * c + ch) * hw + p];
}

void nhwcToNchw(const float* src, float* dst, int64_t n, int64_t c, int64_t h, int64_t w) {
  const int64_t hw = h * w;
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) dst[(b * c + ch) * hw + p] = src[(b * hw + p) * c + ch];
}

std::unique_ptr<Backend> makeBackend(const Device& device, const BackendOptions& options) {
  std::unique_ptr<Backend> backend = device.isCpu() ? std::make_unique<CpuBackend>() : cuda::makeBackend(device.index);
  backend->options = options;
  return backend;
}

}  // namespace accordion
