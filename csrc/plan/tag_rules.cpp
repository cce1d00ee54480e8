#include "plan/tag_rules.h"

#include <algorithm>

#include "plan/plan.h"

namespace fast_ulysses {

void check_tag_use(const std::string& tag, int64_t tags_so_far, bool known, bool deferred) {
  if (!known && tags_so_far >= kMaxTags)
    throw PlanError("tag '" + tag + "' would be the group's tag number " +
                    std::to_string(tags_so_far + 1) + ": at most " + std::to_string(kMaxTags) +
                    " distinct tags per group");
  if (deferred)
    throw PlanError("tag '" + tag +
                    "' was last used with barrier=False and group.barrier() has not run since: "
                    "call group.barrier() before reusing the tag");
}

std::string backward_tag(const std::string& tag) {
  return tag + kBackwardSuffix;
}

int64_t window_for_call(const std::string& tag, int64_t bytes, int64_t held_bytes, bool sealed) {
  if (held_bytes >= bytes) return held_bytes;
  if (sealed)
    throw PlanError("tag '" + tag + "' needs a window of " + std::to_string(bytes) + " bytes but " +
                    (held_bytes < 0 ? std::string("it was not declared")
                                    : "it was declared with " + std::to_string(held_bytes)) +
                    " and the pool is sealed by reserve(): declare this call in reserve()");
  return held_bytes < 0 ? bytes : std::max(bytes, held_bytes * 3 / 2);
}

}  // namespace fast_ulysses
