#include "transport/watchdog.h"

#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <utility>
#include <vector>

namespace fast_ulysses::transport {

Watchdog::Watchdog(std::string group_name, int device_index, const Handshake& handshake,
                   WatchdogSettings settings)
    : group_name_(std::move(group_name)),
      device_index_(device_index),
      handshake_(handshake),
      timeout_s_(settings.timeout_s),
      action_(settings.action) {
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

void Watchdog::watch(std::shared_ptr<cudaEvent_t> event, CallKind kind,
                     std::shared_ptr<const std::string> tag, int slot, uint64_t call) {
  if (timeout_s_ <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back({std::move(event), kind, std::move(tag), slot, call,
                      std::chrono::steady_clock::now()});
}

void Watchdog::run() {
  cudaSetDevice(device_index_);
  // This thread's CUDA calls (event queries, the report's reads) must never invalidate a graph
  // capture running on the caller's thread, as they would under the default global mode.
  cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
  cudaThreadExchangeStreamCaptureMode(&relaxed);
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
    // Reading flag words blocks on the device: never while holding the lock watch() needs.
    lock.unlock();
    for (const auto& [entry, waited] : due) {
      try {
        report(entry, waited);
      } catch (const std::exception& error) {  // never let the watchdog take the process down
        std::fprintf(stderr, "fast-ulysses watchdog: %s (report failed: %s)\n",
                     describe(entry).c_str(), error.what());
      }
      if (action_ == WatchdogAction::kAbort) {
        std::fprintf(stderr, "fast-ulysses watchdog: ending this process "
                             "(FAST_ULYSSES_WATCHDOG_ACTION=abort; 'report' only reports)\n");
        std::fflush(stderr);
        std::_Exit(EXIT_FAILURE);
      }
    }
    lock.lock();
  }
}

std::string Watchdog::describe(const Entry& entry) const {
  std::ostringstream what;
  what << "rank " << handshake_.rank() << ": ";
  if (entry.kind == CallKind::kBarrier) {
    what << "barrier #" << entry.call;
  } else {
    what << (entry.kind == CallKind::kBorrowed ? "borrowed call #" : "call #") << entry.call
         << " of tag '" << *entry.tag << "'";
  }
  return what.str();
}

void Watchdog::report(const Entry& entry, double waited_s) const {
  const int P = handshake_.world_size();
  const int me = handshake_.rank();
  std::ostringstream message;
  message << "fast-ulysses watchdog: group '" << group_name_ << "': " << describe(entry)
          << " has not completed after " << static_cast<int64_t>(waited_s) << " s. Flags on "
          << "this rank, per peer:";
  auto list = [&](const char* name, Word word) {
    message << " " << name << " [";
    for (int p = 0; p < P; ++p)
      message << (p ? " " : "") << (p == me ? "-" : std::to_string(handshake_.read(entry.slot, word, p)));
    message << "]";
  };
  if (entry.kind == CallKind::kBarrier) {
    list("barrier-A (1 = peer arrived)", Word::kBarrierA);
    list("barrier-B", Word::kBarrierB);
  } else {
    list("held (1 = peer has not released its window yet)", Word::kHeld);
    list("held-owned", Word::kHeldOwned);
    list("landed (1 = peer's chunk arrived, not yet consumed)", Word::kLanded);
  }
  message << ". A peer that lags is stuck, has died, or issued a different call sequence "
             "(set FAST_ULYSSES_DEBUG=1 to check every call's agreement across ranks).\n";
  std::fputs(message.str().c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace fast_ulysses::transport
