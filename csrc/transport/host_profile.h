// Host time per stage of the fast path's calls, for finding where a call's microseconds go.
// Off unless FAST_ULYSSES_HOST_PROFILE=1: then each stage boundary reads the steady clock once
// (about 20 ns); off, a stage boundary is one branch.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace fast_ulysses::transport {

// In the order a call passes them; the time since the previous boundary is charged to each.
enum class Stage {
  kPlan,      // op entry: group lookup, rank and input checks, plan cache
  kSetup,     // capture check, tag, window, result tensor
  kOpen,      // fork into M (and the opening handshake batch of a fused call)
  kSend,      // opening handshake, remote copies and closing handshake (eager_graph.h: one
              // graph launch, or call by call); a fused call: its kernel
  kOwnShare,  // this rank's own share, on the caller's stream (in kSend when a cached graph holds
              // it)
  kClose,     // a fused call's closing handshake batch
  kFinish,    // owned: collect copies and release; both: events, joins, watchdog
  kCount
};

class HostProfile {
 public:
  explicit HostProfile(bool enabled) : enabled_(enabled) {}
  bool enabled() const { return enabled_; }
  // A call begins (its first stage is timed from here).
  void start() {
    if (enabled_) last_ = Clock::now();
  }
  // The stage `stage` ends now.
  void mark(Stage stage) {
    if (!enabled_) return;
    const auto now = Clock::now();
    ns_[static_cast<size_t>(stage)] +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - last_).count();
    last_ = now;
  }
  // A call ends: counted (its last mark was its last stage).
  void end_call() {
    if (enabled_) ++calls_;
  }
  static const std::vector<std::string>& stage_names();
  // Nanoseconds per stage summed over the calls since the last take(), and the number of calls;
  // resets both.
  std::pair<std::vector<int64_t>, int64_t> take();

 private:
  using Clock = std::chrono::steady_clock;
  bool enabled_;
  Clock::time_point last_{};
  std::array<int64_t, static_cast<size_t>(Stage::kCount)> ns_{};
  int64_t calls_ = 0;
};

// One call's share of the profile, for its scope: constructing it ends the call's first stages
// (up to `ended`), leaving the scope counts the call (HostProfile::end_call), on every way out.
class ProfiledCall {
 public:
  ProfiledCall(HostProfile& profile, Stage ended) : profile_(profile) { profile_.mark(ended); }
  ~ProfiledCall() { profile_.end_call(); }
  ProfiledCall(const ProfiledCall&) = delete;
  ProfiledCall& operator=(const ProfiledCall&) = delete;

 private:
  HostProfile& profile_;
};

// One stage of a call, for its scope: leaving the scope ends `stage`, which is charged the time
// since the previous boundary (so whatever ran since then, in this scope or before it).
class StageScope {
 public:
  StageScope(HostProfile& profile, Stage stage) : profile_(profile), stage_(stage) {}
  ~StageScope() { profile_.mark(stage_); }
  StageScope(const StageScope&) = delete;
  StageScope& operator=(const StageScope&) = delete;

 private:
  HostProfile& profile_;
  Stage stage_;
};

}  // namespace fast_ulysses::transport
