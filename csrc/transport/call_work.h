// The c10d::Work of an eager call whose caller's stream does not wait for it yet: the result is
// registered with it (c10d::register_work), so c10d's wait_tensor (what an
// AsyncCollectiveTensor runs on its first use) makes the stream current at that point wait for
// the call's closing event, on the device; the host never blocks. Work the caller queues before
// that runs beside the transfer.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>

#include "transport/event_pool.h"

namespace fast_ulysses::transport {

// What an eager call asks of the group on this thread: whether its caller's stream may be left
// to wait later (UlyssesGroup's typed entry asks; the ops under torch.compile, the autograd
// backward and every other route do not), and whether the last call did so.
struct JoinRequest {
  bool defer = false;     // set by the entry for the duration of one call
  bool deferred = false;  // set by the group: the last call registered a CallWork for its result
};
JoinRequest& join_request();  // this thread's

class CallWork : public c10d::Work {
 public:
  CallWork(EventPool::Event done, int device_index);
  // The current stream (of the call's device) waits for the call's closing event; once.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  bool isCompleted() override;
  bool isSuccess() const override { return true; }
  // Whether wait() ran (wait_tensor then also removed it from c10d's registry).
  bool waited() const { return waited_.load(std::memory_order_acquire); }
  // Whether the device has passed the closing event (so nothing is left to wait for).
  bool done() const;

 private:
  EventPool::Event done_;
  int device_index_;
  std::atomic<bool> waited_{false};
};

}  // namespace fast_ulysses::transport
