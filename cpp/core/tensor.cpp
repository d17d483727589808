#include "core/tensor.h"

namespace accordion {

namespace {

class HostAllocator : public Allocator {
 public:
  Device device() const override { return Device::cpu(); }
  std::shared_ptr<void> allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, ((bytes + 63) / 64) * 64);
    if (!p) throw EngineError("ERR_OUT_OF_MEMORY", "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
    return std::shared_ptr<void>(p, std::free);
  }
};

}  // namespace

Allocator& hostAllocator() {
  static HostAllocator allocator;
  return allocator;
}

}  // namespace accordion
