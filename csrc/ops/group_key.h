// A UlyssesGroup's key: how every op names the group it runs on (the ops' `group_name`).
//
// The first group live on a process group takes the c10d name itself (ProcessGroup.group_name);
// another one built on the same process group while it lives takes that name + kGroupKeySuffix +
// a number (create_group picks it). So several groups may share one process group (a probe, or
// one group per role) and torch.ops calls that pass ProcessGroup.group_name reach the group that
// holds the plain name (the first built while none held it: once it is gone, the next one built).
// What asks c10d (ranks, sizes, the symmetric-memory rendezvous) uses process_group_name(key).
#pragma once

#include <string>

namespace fast_ulysses::ops {

inline constexpr char kGroupKeySuffix[] = "@fast_ulysses:";

inline std::string process_group_name(const std::string& key) {
  const auto at = key.rfind(kGroupKeySuffix);
  return at == std::string::npos ? key : key.substr(0, at);
}

}  // namespace fast_ulysses::ops
