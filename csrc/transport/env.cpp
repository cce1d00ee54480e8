#include "transport/env.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <cstdlib>

namespace fast_ulysses::transport {
namespace {

const char* value_of(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0' ? value : nullptr;
}

// A 0|1 switch: unset or empty gives `fallback`; anything else is an error naming the variable.
bool switch_value(const char* name, bool fallback, const char* meaning) {
  const char* text = value_of(name);
  if (text == nullptr) return fallback;
  const std::string value(text);
  TORCH_CHECK_VALUE(value == "0" || value == "1", name, "=", value, ": must be ", meaning);
  return value == "1";
}

}  // namespace

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
    TORCH_CHECK_VALUE(action == "report" || action == "abort", "FAST_ULYSSES_WATCHDOG_ACTION=",
                      action, ": must be 'report' or 'abort'");
    settings.action = action == "report" ? WatchdogAction::kReport : WatchdogAction::kAbort;
  }
  return settings;
}

bool copy_batch_enabled() {
  return switch_value("FAST_ULYSSES_COPY_BATCH", true,
                      "1 (one batched copy call per handshake) or 0 (a call per copy)");
}

bool eager_graphs_enabled() {
  return switch_value("FAST_ULYSSES_EAGER_GRAPHS", true,
                      "0 (call by call) or 1 (eager calls launched from cached CUDA graphs)");
}

bool host_profile_enabled() {
  return switch_value("FAST_ULYSSES_HOST_PROFILE", false,
                      "0 (off) or 1 (time each stage of every call on the host)");
}

}  // namespace fast_ulysses::transport
