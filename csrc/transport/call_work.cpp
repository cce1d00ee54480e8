#include "transport/call_work.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "transport/cuda_check.h"

namespace fast_ulysses::transport {

JoinRequest& join_request() {
  thread_local JoinRequest request;
  return request;
}

CallWork::CallWork(EventPool::Event done, int device_index)
    : c10d::Work(-1, c10d::OpType::ALLTOALL), done_(std::move(done)), device_index_(device_index) {}

bool CallWork::wait(std::chrono::milliseconds /*timeout*/) {
  if (!waited_.exchange(true, std::memory_order_acq_rel)) {
    c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index_));
    FU_CUDA_CHECK(cudaStreamWaitEvent(
        c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device_index_)).stream(),
        *done_, 0));
  }
  return true;
}

void CallWork::synchronize() { wait(); }

bool CallWork::isCompleted() { return done(); }

bool CallWork::done() const { return cudaEventQuery(*done_) == cudaSuccess; }

}  // namespace fast_ulysses::transport
