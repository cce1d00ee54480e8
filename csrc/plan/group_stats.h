// The keys of a group's stats(), in order: the one list both groups answer with. UlyssesGroup
// (csrc/transport) fills every key; TorchUlyssesGroup, which has no window pool, no handshake and
// no graphs, fills sealed, tags and deferred and answers 0 for the rest (Python reads the list
// through `_C.GROUP_STATS_KEYS`, csrc/ops/module_c.cpp). docs/API.md says what each key means.
#pragma once

#include <array>

namespace fast_ulysses {

enum class Stat {
  kPoolBytes,
  kUsedBytes,
  kSegments,
  kSealed,
  kTags,
  kDeferred,
  kGraphCalls,
  kGraphsCached,
  kEagerOnlySignatures,
  kWideFlags,
  kCount
};

constexpr std::array<const char*, static_cast<size_t>(Stat::kCount)> kStatNames = {
    "pool_bytes",  "used_bytes",    "segments",
    "sealed",      "tags",          "deferred",
    "graph_calls", "graphs_cached", "eager_only_signatures",
    "wide_flags"};

}  // namespace fast_ulysses
