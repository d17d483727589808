#include "core/block_cache.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/errors.h"

namespace accordion {

struct BlockCache::Lists {
  std::mutex mutex;
  std::map<size_t, std::vector<void*>> free;  // by rounded size
  int64_t allocated = 0, peak = 0;
  ~Lists() {
    for (auto& [bytes, blocks] : free)
      for (void* p : blocks) std::free(p);
  }
};

BlockCache::BlockCache() : lists_(std::make_shared<Lists>()) {}

std::shared_ptr<void> BlockCache::allocate(size_t bytes) {
  const size_t rounded = ((bytes + 63) / 64) * 64;
  void* p = nullptr;
  {
    std::lock_guard<std::mutex> lock(lists_->mutex);
    auto it = lists_->free.find(rounded);
    if (it != lists_->free.end() && !it->second.empty()) {
      p = it->second.back();
      it->second.pop_back();
    }
    lists_->allocated += static_cast<int64_t>(rounded);
    if (lists_->allocated > lists_->peak) lists_->peak = lists_->allocated;
  }
  if (!p) p = std::aligned_alloc(64, rounded);
  if (!p) {
    std::lock_guard<std::mutex> lock(lists_->mutex);
    lists_->allocated -= static_cast<int64_t>(rounded);
    throw EngineError("ERR_OUT_OF_MEMORY", "cannot allocate " + std::to_string(bytes) + " bytes of host memory");
  }
  std::shared_ptr<Lists> lists = lists_;
  return std::shared_ptr<void>(p, [lists, rounded](void* block) {
    std::lock_guard<std::mutex> lock(lists->mutex);
    lists->free[rounded].push_back(block);
    lists->allocated -= static_cast<int64_t>(rounded);
  });
}

int64_t BlockCache::allocated() const {
  std::lock_guard<std::mutex> lock(lists_->mutex);
  return lists_->allocated;
}

int64_t BlockCache::peak() const {
  std::lock_guard<std::mutex> lock(lists_->mutex);
  return lists_->peak;
}

void BlockCache::resetPeak() {
  std::lock_guard<std::mutex> lock(lists_->mutex);
  lists_->peak = lists_->allocated;
}

}  // namespace accordion
