#include "transport/host_profile.h"

namespace fast_ulysses::transport {

const std::vector<std::string>& HostProfile::stage_names() {
  static const std::vector<std::string> names = {"plan",      "setup", "open",  "send",
                                                 "own_share", "close", "finish"};
  static_assert(static_cast<size_t>(Stage::kCount) == 7, "one name per stage");
  return names;
}

std::pair<std::vector<int64_t>, int64_t> HostProfile::take() {
  std::pair<std::vector<int64_t>, int64_t> out{{ns_.begin(), ns_.end()}, calls_};
  ns_.fill(0);
  calls_ = 0;
  return out;
}

}  // namespace fast_ulysses::transport
