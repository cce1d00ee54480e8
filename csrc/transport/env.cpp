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
  const char* text = value_of("FAST_ULYSSES_COPY_BATCH");
  if (text == nullptr) return true;
  const std::string value(text);
  TORCH_CHECK_VALUE(value == "0" || value == "1", "FAST_ULYSSES_COPY_BATCH=", value,
                    ": must be 1 (one batched copy call per handshake) or 0 (a call per copy)");
  return value == "1";
}

}  // namespace fast_ulysses::transport
