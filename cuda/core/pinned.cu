// Page-locked host memory, cached: pinning is slow (it maps pages for the device and may wait for
// it), so freed blocks are kept by size class and handed out again. A block is pinned in the
// context of the process's GPU (core/current_device.h), set on the calling thread first: the batch
// thread of a worker on GPU 1 must not create a context on GPU 0. The blocks are portable, so any
// device copies from them.
#include <map>
#include <mutex>
#include <vector>

#include "core/check.h"
#include "core/cuda.h"
#include "core/current_device.h"

namespace accordion::cuda {

namespace {

class PinnedAllocator : public Allocator {
 public:
  Device device() const override { return Device::cpu(); }

  std::shared_ptr<void> allocate(size_t bytes) override { return allocateOn(processDevice(), bytes); }

  std::shared_ptr<void> allocateOn(int device, size_t bytes) {
    const size_t size = sizeClass(bytes);
    void* block = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto& blocks = free_[size];
      if (!blocks.empty()) {
        block = blocks.back();
        blocks.pop_back();
      }
    }
    if (!block) {
      const DeviceScope scope(device);
      const cudaError_t status = cudaHostAlloc(&block, size, cudaHostAllocPortable);
      if (status != cudaSuccess) {
        cudaGetLastError();
        throw EngineError(status == cudaErrorInsufficientDriver || status == cudaErrorNoDevice ? "ERR_NO_CUDA_DEVICE" : "ERR_OUT_OF_MEMORY",
                          "cannot allocate " + std::to_string(bytes) + " bytes of pinned host memory: " + cudaGetErrorString(status));
      }
    }
    return std::shared_ptr<void>(block, [this, size](void* p) {
      std::lock_guard<std::mutex> lock(mutex_);
      free_[size].push_back(p);
    });
  }

 private:
  // Powers of two from 4 KiB, so blocks of nearby sizes (the last, smaller batch of an epoch) share.
  static size_t sizeClass(size_t bytes) {
    size_t size = 4096;
    while (size < bytes) size <<= 1;
    return size;
  }
  std::mutex mutex_;
  std::map<size_t, std::vector<void*>> free_;
};

}  // namespace

namespace {

PinnedAllocator& thePinnedAllocator() {
  static PinnedAllocator* allocator = new PinnedAllocator();  // never destroyed: blocks may be freed at exit
  return *allocator;
}

}  // namespace

Allocator& pinnedAllocator() { return thePinnedAllocator(); }

std::shared_ptr<void> pinnedOn(int device, size_t bytes) { return thePinnedAllocator().allocateOn(device, bytes); }

}  // namespace accordion::cuda
