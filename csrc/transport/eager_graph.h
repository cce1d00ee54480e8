// Eager calls replayed from cached CUDA graphs. The part of a call that goes on the
// communication stream (opening handshake, peer copies, closing handshake: one driver call per
// copy and per memop batch, 60-70 us of host time at P = 8 on an H200 shared by eight ranks) is
// captured once per call signature and then issued with one cudaGraphLaunch, its copies'
// source moved to the call's x when x moved. This is safe because the handshake's flags hold only
// constants (handshake.h): a graph of a call is the same work as the eager call.
//
// A signature (EagerGraphs::Key) is everything the captured work depends on but x's address:
// tag slot, owned/deferred, the window's address on every rank, every peer copy's geometry, and
// x's 16-byte alignment (which decides copy engine or kernel). A capture whose graph holds
// anything but copies from x and memop batches, or that CUDA refuses, marks the signature
// eager-only; so does a refused source update. Nothing is ever issued twice.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

namespace fast_ulysses::transport {

class EagerGraphs {
 public:
  using Key = std::vector<int64_t>;
  // Issues the captured work of `key` on `stream`, reading x at `x` (x_bytes long): true when
  // it did. On a key seen for the first time, `issue(capture_stream)` issues that work onto a
  // stream being captured; it must issue nothing anywhere else. False: nothing was issued (the
  // key is eager-only), and the caller issues the work itself.
  bool launch(const Key& key, const char* x, int64_t x_bytes, cudaStream_t stream,
              const std::function<void(cudaStream_t)>& issue);

  // Calls issued from a cached graph so far; signatures cached as graphs (usable) or eager-only.
  int64_t launches() const { return launches_; }
  int64_t signatures(bool usable) const;

  explicit EagerGraphs(bool enabled) : enabled_(enabled) {}
  ~EagerGraphs();
  EagerGraphs(const EagerGraphs&) = delete;
  EagerGraphs& operator=(const EagerGraphs&) = delete;

 private:
  struct Copy {
    cudaGraphNode_t node;
    cudaMemcpy3DParms params;  // as captured, reading the captured x
  };
  struct Entry {
    bool usable = false;
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    const char* captured_x = nullptr;  // x's address in `params`
    const char* current_x = nullptr;   // x's address in the executable graph now
    std::vector<Copy> copies;
  };
  struct KeyHash {
    size_t operator()(const Key& key) const;
  };

  Entry capture(const char* x, int64_t x_bytes, const std::function<void(cudaStream_t)>& issue);
  bool point_at(Entry& entry, const char* x);
  static void release(Entry& entry);

  bool enabled_;
  int64_t launches_ = 0;
  cudaStream_t capture_stream_ = nullptr;
  std::unordered_map<Key, Entry, KeyHash> entries_;
};

}  // namespace fast_ulysses::transport
