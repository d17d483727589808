// Host memory for a backend's tensors, kept for reuse: a block freed by its last owner waits in a
// list of blocks of its exact size until an allocation of that size takes it again. Activations
// and gradients of one step come and go in the same sizes step after step, so after the first
// step nothing is allocated or first touched (no page faults on the hot path), and a gradient
// buffer that backward has finished with serves the next layer of its shape. Thread-safe; blocks
// outlive the cache that handed them out (each owner keeps its list alive). Counts the bytes held
// by owners now and at most, as a device's pool does.
#pragma once
#include <cstddef>
#include <memory>

#include "core/tensor.h"

namespace accordion {

class BlockCache : public Allocator {
 public:
  BlockCache();
  Device device() const override { return Device::cpu(); }
  std::shared_ptr<void> allocate(size_t bytes) override;
  // Bytes held by owners now, and at most since the cache began or resetPeak().
  int64_t allocated() const;
  int64_t peak() const;
  void resetPeak();

 private:
  struct Lists;
  std::shared_ptr<Lists> lists_;
};

}  // namespace accordion
