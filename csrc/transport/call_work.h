// The c10d::Work of an eager call whose caller's stream does not wait for it yet: the result is
// registered with it (c10d::register_work), so c10d's wait_tensor (what an
// AsyncCollectiveTensor runs on its first use) makes the stream current at that point wait for
// the call's closing event, on the device; the host never blocks. Work the caller queues before
// that runs beside the transfer.
//
// It also holds the tensors the communication stream still reads or writes (the input, an owned
// result), so that their memory is not handed to other work on the caller's stream C before the
// call is done there: it lets go of them once C itself waited (wait() on C), or once the group
// finds the device past the call. (recordStream would do the same but delays every reuse of
// the memory until the allocator sees the event complete; holding them lets a result consumed on
// C be reused at once, at the same address.)
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <mutex>
#include <vector>

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
  CallWork(EventPool::Event done, int device_index, cudaStream_t caller,
           std::vector<at::Tensor> held);
  // The current stream (of the call's device) waits for the call's closing event; once. On the
  // caller's stream, or with the device past the call, it also lets go of the held tensors. A
  // stream being captured cannot wait for eager work: there the device must be past the call
  // already (torch.cuda.graph synchronizes before capturing), else it raises.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;
  bool isCompleted() override;
  bool isSuccess() const override { return true; }
  // Whether wait() ran (wait_tensor then also removed it from c10d's registry).
  bool waited() const { return waited_.load(std::memory_order_acquire); }
  // Whether the device has passed the closing event (so nothing is left to wait for).
  bool done() const;
  // Whether it still holds tensors (waited on another stream than the caller's, or not yet).
  bool holds() const;
  void release();
  // Makes the caller's stream wait for the call (on the device, unchecked), then lets go of the
  // held tensors: for a group going away with calls still in flight.
  void release_after_caller();

 private:
  EventPool::Event done_;
  int device_index_;
  cudaStream_t caller_;
  std::atomic<bool> waited_{false};
  mutable std::mutex mutex_;
  std::vector<at::Tensor> held_;
};

}  // namespace fast_ulysses::transport
