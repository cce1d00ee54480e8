// Reports a stuck handshake instead of letting a broken call contract hang in silence.
//
// Each eager call hands its closing event to watch() with what it is (no string is built on the
// hot path). A thread polls the oldest unfinished events every 200 ms; one still unfinished
// after `timeout_s` is reported once on stderr with the flag words it waits on. Stream memory
// waits cannot be cancelled from the host, so with WatchdogAction::kAbort (the default, as
// torch's NCCL watchdog tears a hung job down) the process then exits non-zero, which lets
// torchrun end the job; kReport only reports. Calls captured in a CUDA graph are not watched (a
// captured event cannot be queried).
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "env/env.h"
#include "transport/handshake.h"

namespace fast_ulysses::transport {

enum class CallKind { kOwned, kBorrowed, kBarrier };

// What a report names a watched call by: its tag, its signature (plan/call_signature.h, the
// value this rank's release writes and its acquire awaits) and a description of the call. The
// group builds it when a tag's signature changes, never per call.
struct WatchedCall {
  std::string tag;
  uint32_t signature = 0;
  std::string text;
};

class Watchdog {
 public:
  // settings.timeout_s <= 0 disables it (watch() then does nothing).
  Watchdog(std::string group_name, int device_index, const Handshake& handshake,
           WatchdogSettings settings);
  ~Watchdog();

  // Whether watch() keeps anything: callers skip recording an event for a disabled watchdog.
  bool enabled() const { return timeout_s_ > 0; }

  // `what` is null for a barrier; `call` counts the calls of the tag (or barriers), from 1.
  void watch(std::shared_ptr<cudaEvent_t> event, CallKind kind,
             std::shared_ptr<const WatchedCall> what, int slot, uint64_t call);

 private:
  struct Entry {
    std::shared_ptr<cudaEvent_t> event;
    CallKind kind;
    std::shared_ptr<const WatchedCall> what;
    int slot;
    uint64_t call;
    std::chrono::steady_clock::time_point issued;
    bool reported = false;
  };

  void run();
  std::string describe(const Entry& entry) const;
  void report(const Entry& entry, double waited_s) const;

  std::string group_name_;
  int device_index_;
  const Handshake& handshake_;
  double timeout_s_;
  WatchdogAction action_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Entry> entries_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace fast_ulysses::transport
