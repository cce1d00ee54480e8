#include "transport/eager_graph.h"

#include <cuda.h>

#include <exception>

#include "transport/cuda_check.h"

namespace fast_ulysses::transport {
namespace {

// Signatures kept at once; past that the cache starts over (shapes that vary without end).
constexpr size_t kMaxEntries = 64;

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

size_t EagerGraphs::KeyHash::operator()(const Key& key) const {
  size_t hash = key.size();
  for (int64_t v : key)
    hash ^= std::hash<int64_t>{}(v) + 0x9e3779b97f4a7c15ULL + (hash << 6) + (hash >> 2);
  return hash;
}

EagerGraphs::~EagerGraphs() {
  for (auto& [key, entry] : entries_) release(entry);
  if (capture_stream_ != nullptr) cudaStreamDestroy(capture_stream_);
}

void EagerGraphs::release(Entry& entry) {
  // An executable graph still running is freed when it completes (cudaGraphExecDestroy).
  if (entry.exec != nullptr) cudaGraphExecDestroy(entry.exec);
  if (entry.graph != nullptr) cudaGraphDestroy(entry.graph);
  entry = Entry{};
}

bool EagerGraphs::launch(const Key& key, const char* x, int64_t x_bytes, cudaStream_t stream,
                         const std::function<void(cudaStream_t)>& issue) {
  if (!enabled_) return false;
  auto found = entries_.find(key);
  if (found == entries_.end()) {
    if (entries_.size() >= kMaxEntries) {
      for (auto& [old_key, entry] : entries_) release(entry);
      entries_.clear();
    }
    found = entries_.emplace(key, capture(x, x_bytes, issue)).first;
  }
  Entry& entry = found->second;
  if (!entry.usable || !point_at(entry, x)) return false;
  FU_CUDA_CHECK(cudaGraphLaunch(entry.exec, stream));
  ++launches_;
  return true;
}

EagerGraphs::Entry EagerGraphs::capture(const char* x, int64_t x_bytes,
                                        const std::function<void(cudaStream_t)>& issue) {
  if (capture_stream_ == nullptr)
    FU_CUDA_CHECK(cudaStreamCreateWithFlags(&capture_stream_, cudaStreamNonBlocking));
  Entry entry;
  cudaGraph_t graph = nullptr;
  {
    // Thread-local: a call of another thread (the watchdog's) is not caught in this capture.
    FU_CUDA_CHECK(cudaStreamBeginCapture(capture_stream_, cudaStreamCaptureModeThreadLocal));
    CaptureGuard guard(capture_stream_);
    try {
      issue(capture_stream_);
    } catch (const std::exception&) {
      return entry;  // eager-only; the eager call that follows raises what is really wrong
    }
    graph = guard.end();
  }
  if (graph == nullptr) return entry;  // eager-only
  entry.graph = graph;
  size_t count = 0;
  FU_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &count));
  std::vector<cudaGraphNode_t> nodes(count);
  FU_CUDA_CHECK(cudaGraphGetNodes(graph, nodes.data(), &count));
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type;
    FU_CUDA_CHECK(cudaGraphNodeGetType(node, &type));
    if (static_cast<int>(type) == static_cast<int>(CU_GRAPH_NODE_TYPE_BATCH_MEM_OP)) continue;
    if (type != cudaGraphNodeTypeMemcpy) {  // a kernel (rows the copy engines are not given)
      release(entry);
      return entry;
    }
    Copy copy{node, {}};
    FU_CUDA_CHECK(cudaGraphMemcpyNodeGetParams(node, &copy.params));
    const char* src = static_cast<const char*>(copy.params.srcPtr.ptr);
    if (copy.params.srcArray != nullptr || src < x || src >= x + x_bytes) {
      release(entry);
      return entry;
    }
    entry.copies.push_back(copy);
  }
  if (cudaGraphInstantiate(&entry.exec, graph, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    entry.exec = nullptr;
    release(entry);
    return entry;
  }
  entry.captured_x = entry.current_x = x;
  entry.usable = true;
  return entry;
}

// Moves every copy's source to read x at `x`; false (and the entry eager-only) if CUDA refused.
bool EagerGraphs::point_at(Entry& entry, const char* x) {
  if (x == entry.current_x) return true;
  for (const Copy& copy : entry.copies) {
    cudaMemcpy3DParms params = copy.params;
    params.srcPtr.ptr = const_cast<char*>(x) +
                        (static_cast<const char*>(copy.params.srcPtr.ptr) - entry.captured_x);
    if (cudaGraphExecMemcpyNodeSetParams(entry.exec, copy.node, &params) != cudaSuccess) {
      (void)cudaGetLastError();
      release(entry);
      return false;
    }
  }
  entry.current_x = x;
  return true;
}

int64_t EagerGraphs::signatures(bool usable) const {
  int64_t n = 0;
  for (const auto& [key, entry] : entries_) n += entry.usable == usable;
  return n;
}

}  // namespace fast_ulysses::transport
