// Every FAST_ULYSSES_* environment setting of the package, parsed in one place: the transport
// reads its own here, and Python reads the rest (and the doctor checks them all) through the
// `_C` module functions `env_switch` and `check_env` (csrc/ops/module_c.cpp). A value that does
// not parse is an error naming the variable and the rule (c10::ValueError, Python ValueError),
// never a silent default; unset or empty gives the default.
#pragma once

#include <string>
#include <vector>

namespace fast_ulysses {

// The 0|1 switches: name, value when unset or empty, and what 0 and 1 mean (the error says it).
struct Switch {
  const char* name;
  bool fallback;
  const char* meaning;
};
const std::vector<Switch>& switches();

// The switch `name` (one of switches(); another name is a c10::Error, a caller's bug).
bool switch_value(const std::string& name);

enum class WatchdogAction { kReport, kAbort };

struct WatchdogSettings {
  double timeout_s = 300.0;                        // FAST_ULYSSES_WATCHDOG_S; 0 disables
  WatchdogAction action = WatchdogAction::kAbort;  // FAST_ULYSSES_WATCHDOG_ACTION=report|abort
};

WatchdogSettings watchdog_settings();

// FAST_ULYSSES_EAGER_GRAPHS=1 (default) | 0: issue an eager call's work from a CUDA graph
// cached per call signature and operands (transport/eager_graph.h), or call by call.
bool eager_graphs_enabled();

// FAST_ULYSSES_HOST_PROFILE=0 (default) | 1: time each stage of every call on the host
// (UlyssesGroup's host_profile op reads the sums).
bool host_profile_enabled();

// Parses every setting above, in the order of switches() then the watchdog's: raises for the
// first bad value (what the doctor runs before anything else).
void check_env();

}  // namespace fast_ulysses
