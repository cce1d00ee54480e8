// The transport's environment settings, parsed in one place. A value that does not parse is an
// error naming the variable and the rule, never a silent default.
#pragma once

#include <string>

namespace fast_ulysses::transport {

enum class WatchdogAction { kReport, kAbort };

struct WatchdogSettings {
  double timeout_s = 300.0;                       // FAST_ULYSSES_WATCHDOG_S; 0 disables
  WatchdogAction action = WatchdogAction::kAbort;  // FAST_ULYSSES_WATCHDOG_ACTION=report|abort
};

// Throws c10::ValueError (Python ValueError) naming the variable on a bad value.
WatchdogSettings watchdog_settings();

// FAST_ULYSSES_COPY_BATCH=1 (default) | 0: issue an eager call's remote copies as one
// cudaMemcpy3DBatchAsync, or one copy call per peer (for A/B measurements).
bool copy_batch_enabled();

// FAST_ULYSSES_EAGER_GRAPHS=1 (default) | 0: issue the communication-stream part of an eager
// call from a CUDA graph cached per call signature and input (eager_graph.h), or call by call.
bool eager_graphs_enabled();

// FAST_ULYSSES_HOST_PROFILE=0 (default) | 1: time each stage of every call on the host
// (UlyssesGroup's host_profile op reads the sums).
bool host_profile_enabled();

}  // namespace fast_ulysses::transport
