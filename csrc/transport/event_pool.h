// Reused CUDA events (timing disabled). A call records two or three events; creating them
// anew cost host time on every call. An event goes back to the pool when its last holder (the
// call itself, the watchdog) lets go of it.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <vector>

namespace fast_ulysses::transport {

class EventPool {
 public:
  using Event = std::shared_ptr<cudaEvent_t>;

  ~EventPool();
  // An event recorded on `stream` now (a graph node when `stream` is capturing).
  Event record(cudaStream_t stream);
  // Makes `waiter` wait for everything issued so far on `from`.
  void join(cudaStream_t from, cudaStream_t waiter);

 private:
  struct Shared {
    std::mutex mutex;
    std::vector<cudaEvent_t> free;
  };
  // Events outlive the pool when the watchdog still holds one: they return to `shared_`, which the
  // last of them frees.
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
};

}  // namespace fast_ulysses::transport
