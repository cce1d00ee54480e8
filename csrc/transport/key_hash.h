// The hash of the transport's cache keys (vectors of int64: plan signatures, eager-graph keys).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

namespace fast_ulysses::transport {

struct KeyHash {
  size_t operator()(const std::vector<int64_t>& key) const {
    size_t hash = key.size();
    for (int64_t v : key)
      hash ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (hash << 6) + (hash >> 2);
    return hash;
  }
};

}  // namespace fast_ulysses::transport
