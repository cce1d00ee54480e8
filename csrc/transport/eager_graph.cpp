#include "transport/eager_graph.h"

#include <exception>

#include "transport/cuda_check.h"
#include "transport/driver_api.h"

namespace fast_ulysses::transport {
namespace {

// Ends the capture on `stream` if an exception leaves it running, so that the stream is usable
// again and no graph leaks.
class CaptureGuard {
 public:
  explicit CaptureGuard(cudaStream_t stream) : stream_(stream) {}
  ~CaptureGuard() {
    if (!active_) return;
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr)
      cudaGraphDestroy(graph);
    (void)cudaGetLastError();
  }
  cudaGraph_t end() {
    active_ = false;
    cudaGraph_t graph = nullptr;
    if (cudaStreamEndCapture(stream_, &graph) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return graph;
  }

 private:
  cudaStream_t stream_;
  bool active_ = true;
};

}  // namespace

EagerGraphs::~EagerGraphs() {
  clear();
  if (capture_stream_ != nullptr) cudaStreamDestroy(capture_stream_);
  if (branch_stream_ != nullptr) cudaStreamDestroy(branch_stream_);
}

cudaStream_t EagerGraphs::branch_stream() {
  if (branch_stream_ == nullptr)
    FU_CUDA_CHECK(cudaStreamCreateWithFlags(&branch_stream_, cudaStreamNonBlocking));
  return branch_stream_;
}

void EagerGraphs::clear() {
  // An executable graph still running completes; its resources are freed then.
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
  signatures_.clear();
}

bool EagerGraphs::launch(const Key& signature, const std::vector<const void*>& operands,
                         cudaStream_t stream, const std::function<void(cudaStream_t)>& issue) {
  if (!enabled_) return false;
  Key key = signature;
  for (const void* operand : operands) {
    // The allocation too: memory freed to the driver and allocated again at the same address
    // is a new allocation (a new buffer ID), and gets a graph of its own.
    unsigned long long buffer = 0;
    const auto address = reinterpret_cast<CUdeviceptr>(operand);
    if (DriverApi::get().pointer_get_attribute(&buffer, CU_POINTER_ATTRIBUTE_BUFFER_ID, address) !=
        CUDA_SUCCESS)
      return false;  // not from a CUDA allocation API (or empty): issued call by call
    key.push_back(static_cast<int64_t>(address));
    key.push_back(static_cast<int64_t>(buffer));
  }
  auto found = graphs_.find(key);
  if (found == graphs_.end()) {
    if (graphs_.size() >= kMaxGraphs) clear();
    Signature& sig = signatures_[signature];
    if (sig.eager_only) return false;
    if (sig.addresses >= kMaxAddresses) {  // operands keep moving: a capture a call costs more
      sig.eager_only = true;
      return false;
    }
    ++sig.addresses;
    cudaGraphExec_t exec = capture(issue);
    if (exec == nullptr) {
      sig.eager_only = true;
      return false;
    }
    found = graphs_.emplace(std::move(key), exec).first;
  }
  FU_CUDA_CHECK(cudaGraphLaunch(found->second, stream));
  ++launches_;
  return true;
}

// The work `issue` puts on a stream, as an executable graph; nullptr where CUDA refused it (the
// eager call that follows issues it call by call, and raises whatever is really wrong).
cudaGraphExec_t EagerGraphs::capture(const std::function<void(cudaStream_t)>& issue) {
  if (capture_stream_ == nullptr)
    FU_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  {
    // Thread-local: a call of another thread (the watchdog's) is not caught in this capture.
    FU_CUDA_CHECK(cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal));
    CaptureGuard guard(capture_stream_);
    try {
      issue(capture_stream_);
    } catch (const std::exception&) {
      return nullptr;
    }
    graph = guard.end();
  }
  if (graph == nullptr) return nullptr;
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);  // the executable graph does not need it
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return exec;
}

int64_t EagerGraphs::eager_only() const {
  int64_t n = 0;
  for (const auto& [key, sig] : signatures_) n += sig.eager_only ? 1 : 0;
  return n;
}

}  // namespace fast_ulysses::transport
