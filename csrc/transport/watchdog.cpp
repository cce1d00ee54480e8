#include "transport/watchdog.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <future>
#include <optional>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace fast_ulysses::transport {
namespace {

// How long a report waits for the flag words before it goes out without them.
constexpr auto kFlagReadDeadline = std::chrono::seconds(5);

// Reads the words at `words` (device addresses; null: not read) on a detached thread of its
// own and waits at most kFlagReadDeadline: with the caller's stream stuck behind the hung
// handshake a device read may block too (suspected, not confirmed, where a rank sharing one GPU
// was never ended by its watchdog), and a report, and the abort after it, must never hang. The
// thread holds only copies, so it may outlive the group; a late read of freed memory returns an
// error, not a crash.
std::optional<std::vector<int64_t>> read_words(std::vector<const char*> words, int device_index) {
  auto promise = std::make_shared<std::promise<std::vector<int64_t>>>();
  auto future = promise->get_future();
  std::thread([promise, words = std::move(words), device_index] {
    cudaSetDevice(device_index);
    cudaStreamCaptureMode relaxed = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&relaxed);
    std::vector<int64_t> values;
    for (const char* word : words) {
      uint32_t value = 0;
      values.push_back(word == nullptr                      ? -1
                       : Handshake::read_word(word, &value) ? static_cast<int64_t>(value)
                                                            : -2);
    }
    promise->set_value(std::move(values));
  }).detach();
  if (future.wait_for(kFlagReadDeadline) != std::future_status::ready) return std::nullopt;
  return future.get();
}

}  // namespace

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
                     std::shared_ptr<const WatchedCall> what, int slot, uint64_t call) {
  if (timeout_s_ <= 0) return;
  std::lock_guard<std::mutex> lock(mutex_);
  entries_.push_back(
      {std::move(event), kind, std::move(what), slot, call, std::chrono::steady_clock::now()});
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
        std::fprintf(stderr,
                     "fast-ulysses watchdog: ending this process "
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
         << " of tag '" << entry.what->tag << "'";
  }
  return what.str();
}

void Watchdog::report(const Entry& entry, double waited_s) const {
  const int P = handshake_.world_size();
  const int me = handshake_.rank();
  std::vector<std::pair<const char*, Word>> lists;
  if (entry.kind == CallKind::kBarrier) {
    lists = {{"barrier-A (1 = peer arrived)", Word::kBarrierA}, {"barrier-B", Word::kBarrierB}};
  } else {
    lists = {{"held (1 = peer has not released its window yet; otherwise the signature of the "
              "call it released it for)",
              Word::kHeld},
             {"held-owned", Word::kHeldOwned},
             {"landed (1 = peer's chunk arrived, not yet consumed)", Word::kLanded}};
  }
  std::vector<const char*> words;
  for (const auto& list : lists)
    for (int p = 0; p < P; ++p)
      words.push_back(p == me ? nullptr : handshake_.mine(entry.slot, list.second, p));
  const auto values = read_words(std::move(words), device_index_);

  std::ostringstream message;
  message << "fast-ulysses watchdog: group '" << group_name_ << "': " << describe(entry)
          << " has not completed after " << static_cast<int64_t>(waited_s) << " s.";
  if (values) {
    message << " Flags on this rank, per peer:";
    size_t i = 0;
    for (const auto& list : lists) {
      message << " " << list.first << " [";
      for (int p = 0; p < P; ++p, ++i) {
        const int64_t v = (*values)[i];
        message << (p ? " " : "") << (v == -1 ? "-" : v == -2 ? "?" : std::to_string(v));
      }
      message << "]";
    }
    message << ".";
    if (entry.what) {
      // A release for another call: the peer's call differs from this rank's.
      for (int p = 0; p < P; ++p) {
        const int64_t v = (*values)[p];
        if (p == me || v < 0 || v == 1 || v == 0 || v == entry.what->signature) continue;
        message << " Rank " << p << " released this rank's window of tag '" << entry.what->tag
                << "' for a different call (signature 0x" << std::hex << v
                << ") than this rank's (signature 0x" << entry.what->signature << std::dec << ": "
                << entry.what->text
                << "): the ranks disagree on the call, and no byte was copied between them "
                   "for it (rank "
                << p << "'s own report names its call).";
      }
    }
  } else {
    message << " (The flag words could not be read within "
            << std::chrono::duration_cast<std::chrono::seconds>(kFlagReadDeadline).count()
            << " s: the device did not answer.)";
  }
  message << " A peer that lags is stuck, has died, or issued a different call sequence "
             "(set FAST_ULYSSES_DEBUG=1 to check every call's agreement across ranks).\n";
  std::fputs(message.str().c_str(), stderr);
  std::fflush(stderr);
}

}  // namespace fast_ulysses::transport
