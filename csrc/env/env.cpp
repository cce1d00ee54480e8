#include "env/env.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <cstdlib>

namespace fast_ulysses {
namespace {

const char* value_of(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

}  // namespace

const std::vector<Switch>& switches() {
  static const std::vector<Switch> all = {
      {"FAST_ULYSSES_DEBUG", false, "0 (off) or 1 (check every call's agreement across ranks)"},
      {"FAST_ULYSSES_CHECK_CALLS", true,
       "1 (the fallback compares every call across ranks before its data moves) or 0 (off)"},
      {"FAST_ULYSSES_ALLOW_SHARED_GPU", false,
       "0 (off) or 1 (accept ranks sharing one GPU: a test set-up)"},
      {"FAST_ULYSSES_EAGER_GRAPHS", true,
       "0 (call by call) or 1 (eager calls launched from cached CUDA graphs)"},
      {"FAST_ULYSSES_HOST_PROFILE", false,
       "0 (off) or 1 (time each stage of every call on the host)"},
  };
  return all;
}

bool switch_value(const std::string& name) {
  for (const Switch& entry : switches()) {
    if (name != entry.name) continue;
    const char* text = value_of(entry.name);
    if (text == nullptr) return entry.fallback;
    const std::string value(text);
    TORCH_CHECK_VALUE(value == "0" || value == "1", entry.name, "=", value, ": must be ",
                      entry.meaning);
    return value == "1";
  }
  TORCH_CHECK(false, "fast-ulysses: no environment switch named '", name, "'");
}

WatchdogSettings watchdog_settings() {
  WatchdogSettings settings;
  if (const char* text = value_of("FAST_ULYSSES_WATCHDOG_S")) {
    char* end = nullptr;
    const double seconds = std::strtod(text, &end);
    TORCH_CHECK_VALUE(end != text && *end == '\0' && std::isfinite(seconds) && seconds >= 0,
                      "FAST_ULYSSES_WATCHDOG_S=", text,
                      ": must be a number of seconds >= 0 (0 disables the watchdog)");
    settings.timeout_s = seconds;
  }
  if (const char* text = value_of("FAST_ULYSSES_WATCHDOG_ACTION")) {
    const std::string action(text);
    TORCH_CHECK_VALUE(action == "report" || action == "abort",
                      "FAST_ULYSSES_WATCHDOG_ACTION=", action, ": must be 'report' or 'abort'");
    settings.action = action == "report" ? WatchdogAction::kReport : WatchdogAction::kAbort;
  }
  return settings;
}

bool eager_graphs_enabled() {
  return switch_value("FAST_ULYSSES_EAGER_GRAPHS");
}

bool host_profile_enabled() {
  return switch_value("FAST_ULYSSES_HOST_PROFILE");
}

void check_env() {
  for (const Switch& entry : switches()) switch_value(entry.name);
  watchdog_settings();
}

}  // namespace fast_ulysses
