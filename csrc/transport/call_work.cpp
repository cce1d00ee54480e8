#include "transport/call_work.h"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include "transport/cuda_check.h"

namespace fast_ulysses::transport {

JoinRequest& join_request() {
  thread_local JoinRequest request;
  return request;
}

CallWork::CallWork(EventPool::Event done, int device_index, cudaStream_t caller,
                   std::vector<at::Tensor> held)
    : c10d::Work(-1, c10d::OpType::ALLTOALL),
      done_(std::move(done)),
      device_index_(device_index),
      caller_(caller),
      held_(std::move(held)) {}

bool CallWork::wait(std::chrono::milliseconds /*timeout*/) {
  if (!waited_.exchange(true, std::memory_order_acq_rel)) {
    const auto device = static_cast<c10::DeviceIndex>(device_index_);
    c10::cuda::CUDAGuard guard(device);
    cudaStream_t current = c10::cuda::getCurrentCUDAStream(device).stream();
    FU_CUDA_CHECK(cudaStreamWaitEvent(current, *done_, 0));
    if (current == caller_) release();  // C is ordered after the call now
  }
  return true;
}

bool CallWork::holds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !held_.empty();
}

void CallWork::release() {
  std::vector<at::Tensor> held;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    held.swap(held_);
  }
}

void CallWork::release_after_caller() {
  if (!holds()) return;
  // The caller's stream waits for the call on the device before the memory can be reused there.
  // Unchecked: from a destructor, possibly at process exit, where the context may be gone and
  // nothing reuses the memory any more.
  if (cudaStreamWaitEvent(caller_, *done_, 0) != cudaSuccess) (void)cudaGetLastError();
  release();
}

void CallWork::synchronize() {
  wait();
}

bool CallWork::isCompleted() {
  return done();
}

bool CallWork::done() const {
  return cudaEventQuery(*done_) == cudaSuccess;
}

}  // namespace fast_ulysses::transport
