#include "transport/watchdog.h"

#include <cstdio>
#include <sstream>
#include <utility>
#include <vector>

namespace fast_ulysses::transport {

Watchdog::Watchdog(std::string group_name, int device_index, int world_size,
                   const Handshake& handshake, double timeout_s)
    : group_name_(std::move(group_name)),
      device_index_(device_index),
      world_size_(world_size),
      handshake_(handshake),
      timeout_s_(timeout_s) {
  if (timeout_s_ > 0) thread_ = std::thread([this] { run(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::watch(std::shared_ptr<cudaEvent_t> event, std::string what, int slot,
                     uint64_t epoch) {
  if (timeout_s_ <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back(
      {std::move(event), std::move(what), slot, epoch, std::chrono::steady_clock::now()});
}

void Watchdog::run() {
  cudaSetDevice(device_index_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_for(lock, std::chrono::milliseconds(200));
    // Events complete in issue order per stream; drop finished ones from the front.
    while (!entries_.empty() && cudaEventQuery(*entries_.front().event) == cudaSuccess)
      entries_.pop_front();
    const auto now = std::chrono::steady_clock::now();
    std::vector<std::pair<Entry, double>> due;
    for (Entry& entry : entries_) {
      const double waited = std::chrono::duration<double>(now - entry.issued).count();
      if (waited < timeout_s_) break;
      if (entry.reported || cudaEventQuery(*entry.event) == cudaSuccess) continue;
      entry.reported = true;
      due.emplace_back(entry, waited);
    }
    // Reading signal words blocks on the device: never while holding the lock watch() needs.
    lock.unlock();
    for (const auto& [entry, waited] : due) {
      try {
        report(entry, waited);
      } catch (const std::exception& error) {  // never let the watchdog take the process down
        std::fprintf(stderr, "fast-ulysses watchdog: %s (report failed: %s)\n",
                     entry.what.c_str(), error.what());
      }
    }
    lock.lock();
  }
}

void Watchdog::report(const Entry& entry, double waited_s) const {
  std::ostringstream message;
  message << "fast-ulysses watchdog: group '" << group_name_ << "': " << entry.what
          << " has not completed after " << static_cast<int64_t>(waited_s) << " s.";
  if (entry.slot == Handshake::kBarrierSlot) {
    message << " Barrier signals (need " << entry.epoch << "):";
    for (int p = 0; p < world_size_; ++p)
      message << " rank " << p << "=" << handshake_.read(entry.slot, Signal::kLanded, p);
  } else {
    message << " Signal words on this rank: consumed (need >= " << entry.epoch - 1 << "):";
    for (int p = 0; p < world_size_; ++p)
      message << " rank " << p << "=" << handshake_.read(entry.slot, Signal::kConsumed, p);
    message << "; landed (need >= " << entry.epoch << "):";
    for (int p = 0; p < world_size_; ++p)
      message << " rank " << p << "=" << handshake_.read(entry.slot, Signal::kLanded, p);
  }
  message << ". A peer that lags is stuck, has died, or issued a different call sequence "
             "(set FAST_ULYSSES_DEBUG=1 to check every call's agreement across ranks).\n";
  std::fputs(message.str().c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace fast_ulysses::transport
