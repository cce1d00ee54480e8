#include "transport/call_work.h"

#include <c10/cuda/CUDAGraphsC10Utils.h>
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

namespace {

bool stream_capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  return cudaStreamIsCapturing(stream, &status) == cudaSuccess &&
         status != cudaStreamCaptureStatusNone;
}

// Whether the device has passed `event` (recorded outside any capture). Relaxed for this thread:
// under a global-mode capture on any thread a query would otherwise invalidate that capture.
bool event_passed(cudaEvent_t event) {
  c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
  const cudaError_t status = cudaEventQuery(event);
  if (status == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  FU_CUDA_CHECK(status);
  return true;
}

}  // namespace

bool CallWork::wait(std::chrono::milliseconds /*timeout*/) {
  if (waited_.load(std::memory_order_acquire)) return true;
  const auto device = static_cast<c10::DeviceIndex>(device_index_);
  c10::cuda::CUDAGuard guard(device);
  cudaStream_t current = c10::cuda::getCurrentCUDAStream(device).stream();
  if (stream_capturing(current)) {
    // A captured stream cannot wait for eager work (the dependency would cross the capture's
    // boundary and invalidate it); torch.cuda.graph synchronizes before capturing, so the
    // device is normally past the call already and nothing is left to wait for.
    TORCH_CHECK(event_passed(*done_),
                "fast-ulysses: the result of an eager all-to-all is first used inside a CUDA "
                "graph capture while the call is still running on the device: wait on the "
                "result (or synchronize) before capturing");
  } else {
    FU_CUDA_CHECK(cudaStreamWaitEvent(current, *done_, 0));
  }
  if (!waited_.exchange(true, std::memory_order_acq_rel) &&
      (current == caller_ || done()))  // C is ordered after the call now
    release();
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
  // The caller's stream waits for the call on the device before the memory can be reused there
  // (the host, while that stream is being captured: a captured wait for eager work would
  // invalidate the capture). Unchecked: from a destructor, possibly at process exit, where the
  // context may be gone and nothing reuses the memory any more.
  if (stream_capturing(caller_)) {
    c10::cuda::CUDAStreamCaptureModeGuard relaxed(cudaStreamCaptureModeRelaxed);
    if (cudaEventSynchronize(*done_) != cudaSuccess) (void)cudaGetLastError();
  } else if (cudaStreamWaitEvent(caller_, *done_, 0) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  release();
}

void CallWork::synchronize() {
  wait();
}

bool CallWork::isCompleted() {
  return done();
}

bool CallWork::done() const {
  return event_passed(*done_);
}

}  // namespace fast_ulysses::transport
