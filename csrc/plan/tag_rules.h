// The per-tag rules of a group, pure C++17 like the plan: both groups apply them, the transport
// directly (csrc/transport) and the torch fallback through the ops (`check_tag_use`,
// `window_for_call`), so that a program that breaks one fails the same way on a CPU test as on
// the GPU. Violations throw PlanError (a ValueError in Python) naming the tag and the rule.
#pragma once

#include <cstdint>
#include <string>

namespace fast_ulysses {

// Distinct tags one group may use (the transport has one signal slot per tag).
constexpr int kMaxTags = 256;

// The backward of a call on `tag` runs on `backward_tag(tag)`, its own window, so it never
// touches a forward window that may still be in use: `tag` + kBackwardSuffix (a double backward
// appends it again).
constexpr const char* kBackwardSuffix = ":grad";
std::string backward_tag(const std::string& tag);

// Before a call on `tag`: `known` whether the group has seen the tag, `tags_so_far` how many
// distinct tags it has seen, `deferred` whether the tag's last call was borrowed with
// barrier=False and barrier() has not run since. Throws unless a new tag fits under kMaxTags
// and the tag is not deferred.
void check_tag_use(const std::string& tag, int64_t tags_so_far, bool known, bool deferred);

// The window a call on `tag` that needs `bytes` gets, given the bytes the tag's window holds
// (`held_bytes`, -1 for none): the held window when it is large enough; otherwise, unless
// `sealed` (reserve() ran), a new one of `bytes`, or for a tag that outgrows its window at
// least 1.5x the old one (a size that creeps up call by call then costs a logarithmic number of
// new windows). Throws when sealed and the tag holds no large enough window.
int64_t window_for_call(const std::string& tag, int64_t bytes, int64_t held_bytes, bool sealed);

}  // namespace fast_ulysses
