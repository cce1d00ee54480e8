// Reports a stuck handshake instead of letting a broken call contract hang in silence.
//
// Each call hands its closing event to watch(). A thread polls the oldest unfinished events
// every 200 ms; one still unfinished after `timeout_s` is reported once on stderr with the
// signal words it waits on (what each peer has consumed and landed against what is needed).
// It reports; it does not cancel: stream memory waits cannot be aborted from the host.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "transport/handshake.h"

namespace fast_ulysses::transport {

class Watchdog {
 public:
  // timeout_s <= 0 disables it (watch() then does nothing).
  Watchdog(std::string group_name, int device_index, int world_size, const Handshake& handshake,
           double timeout_s);
  ~Watchdog();

  void watch(std::shared_ptr<cudaEvent_t> event, std::string what, int slot, uint64_t epoch);

 private:
  struct Entry {
    std::shared_ptr<cudaEvent_t> event;
    std::string what;
    int slot;
    uint64_t epoch;
    std::chrono::steady_clock::time_point issued;
    bool reported = false;
  };

  void run();
  void report(const Entry& entry, double waited_s) const;

  std::string group_name_;
  int device_index_;
  int world_size_;
  const Handshake& handshake_;
  double timeout_s_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Entry> entries_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace fast_ulysses::transport
