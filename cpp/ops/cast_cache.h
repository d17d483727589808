// bf16 compute's cast cache, as autocast's (ops/backend.h: beginCastScope): a parameter's bf16 copy,
// made at its first use in a scope and used again by the scope's later products. `Copy` is where a
// device keeps it (host vectors, device memory), kept between scopes to be filled again.
#pragma once
#include <cstdint>
#include <map>
#include <vector>

#include "ops/backend.h"

namespace accordion {

template <typename Copy>
class CastCache {
 public:
  struct Entry {
    int64_t count = 0;
    Copy copy{};
    bool valid = false;  // filled in this scope
  };

  void setParameters(const std::vector<ConstSpan>& parameters) {
    entries_.clear();
    for (const ConstSpan& p : parameters) entries_[p.data].count = p.size;
  }
  void begin() { inScope_ = true; }
  void end() {
    inScope_ = false;
    for (auto& [address, entry] : entries_) entry.valid = false;
  }
  // The entry of x (n values) inside a scope when x is a parameter; null otherwise (no copy kept).
  Entry* kept(const float* x, int64_t n) {
    if (!inScope_) return nullptr;
    const auto found = entries_.find(x);
    return found != entries_.end() && found->second.count == n ? &found->second : nullptr;
  }

 private:
  std::map<const float*, Entry> entries_;  // one per parameter, by its values' address
  bool inScope_ = false;
};

}  // namespace accordion
