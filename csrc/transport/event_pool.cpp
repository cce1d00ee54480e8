#include "transport/event_pool.h"

#include "transport/cuda_check.h"

namespace fast_ulysses::transport {
namespace {

struct Recycle {
  std::shared_ptr<void> keep;  // the pool's shared state
  std::mutex* mutex;
  std::vector<cudaEvent_t>* free;
  void operator()(cudaEvent_t* event) const {
    {
      std::lock_guard<std::mutex> lock(*mutex);
      free->push_back(*event);
    }
    delete event;
  }
};

}  // namespace

EventPool::~EventPool() {
  std::lock_guard<std::mutex> lock(shared_->mutex);
  for (cudaEvent_t event : shared_->free) cudaEventDestroy(event);
  shared_->free.clear();
}

EventPool::Event EventPool::record(cudaStream_t stream) {
  cudaEvent_t event = nullptr;
  {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (!shared_->free.empty()) {
      event = shared_->free.back();
      shared_->free.pop_back();
    }
  }
  if (event == nullptr) FU_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  Event held(new cudaEvent_t(event), Recycle{shared_, &shared_->mutex, &shared_->free});
  FU_CUDA_CHECK(cudaEventRecord(event, stream));
  return held;
}

void EventPool::join(cudaStream_t from, cudaStream_t waiter) {
  FU_CUDA_CHECK(cudaStreamWaitEvent(waiter, *record(from), 0));
}

}  // namespace fast_ulysses::transport
