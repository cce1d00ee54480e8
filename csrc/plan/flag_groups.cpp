#include "plan/flag_groups.h"

#include <stdexcept>
#include <string>

#include "plan/plan.h"

namespace fast_ulysses {

uint64_t FlagGroup::value(uint32_t value, uint32_t idle) const {
  const uint64_t low = peer[0] ? value : idle;
  if (!wide) return low;
  const uint64_t high = peer[1] ? value : idle;
  return low | high << 32;
}

std::vector<FlagGroup> flag_groups(int world, int me, bool wide) {
  if (world < 1 || world > kMaxWorldSize || me < 0 || me >= world)
    throw std::invalid_argument("flag_groups: rank " + std::to_string(me) + " of " +
                                std::to_string(world) + " ranks (at most " +
                                std::to_string(kMaxWorldSize) + ")");
  const auto is_peer = [&](int index) { return index < world && index != me; };
  std::vector<FlagGroup> groups;
  for (int first = 0; first < world; first += wide ? 2 : 1) {
    FlagGroup group;
    group.first = first;
    group.wide = wide;
    group.peer[0] = is_peer(first);
    group.peer[1] = wide && is_peer(first + 1);
    if (group.peer[0] || group.peer[1]) groups.push_back(group);
  }
  return groups;
}

}  // namespace fast_ulysses
