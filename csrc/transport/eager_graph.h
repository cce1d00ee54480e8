// Eager calls launched from cached CUDA graphs. The part of a call that goes on the
// communication stream (opening handshake, peer copies, closing handshake, and for an owned call
// the copies of the peers' chunks into its result: one driver call per copy and per memop batch,
// whose host cost docs/BENCHMARK.md's launch-probe rows give), with this rank's own share on a
// branch beside it, is captured once per call signature and operands, then issued with one
// cudaGraphLaunch. This is safe because the handshake's flags hold only constants (handshake.h):
// a graph of a call is the same work as the eager call, every time. On unless
// FAST_ULYSSES_EAGER_GRAPHS=0 (env.h).
//
// A key is everything the captured work depends on: tag slot, owned/deferred, whether the opening
// handshake waits for owned results (ulysses_group.h), the window's address on every rank, every
// peer copy's geometry, and the address and allocation of each operand (x, and an owned call's
// result): its CUDA buffer ID, so that memory freed and allocated again at the same address never
// meets a graph made for the old allocation. Addresses are part of the key because CUDA cannot
// move a pitched copy node's source or destination in an executable graph
// (cudaGraphExecMemcpyNodeSetParams takes one-dimensional copies only). A signature (the key
// without the operands) gets a graph for at most kMaxAddresses distinct operands; a signature
// whose operands keep moving past that, or whose capture or instantiation CUDA refuses, is
// issued call by call from then on. Nothing is ever issued twice.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include "transport/key_hash.h"

namespace fast_ulysses::transport {

class EagerGraphs {
 public:
  using Key = std::vector<int64_t>;  // a signature; launch() adds the operands
  // Graphs kept for one signature (distinct operands), and for the whole
  // group; past the latter the cache starts over (shapes that vary without end).
  static constexpr int kMaxAddresses = 8;
  static constexpr size_t kMaxGraphs = 256;

  // Issues the captured work of (`signature`, `operands`) on `stream`: true when it did. The
  // operands are the tensors the work reads or writes that are not the group's own (x, and an
  // owned call's result). On a key seen for the first time, `issue(capture_stream)` issues that
  // work onto a stream being captured; it must issue nothing anywhere else. False: nothing was
  // issued (the signature is eager-only), and the caller issues the work itself.
  bool launch(const Key& signature, const std::vector<const void*>& operands, cudaStream_t stream,
              const std::function<void(cudaStream_t)>& issue);

  // A second stream for `issue` to fork a branch of the captured work onto (through events
  // from and back to its capture stream), created on first use.
  cudaStream_t branch_stream();

  bool enabled() const { return enabled_; }
  // Calls launched from a cached graph so far; graphs cached; signatures issued call by call.
  int64_t launches() const { return launches_; }
  int64_t graphs() const { return static_cast<int64_t>(graphs_.size()); }
  int64_t eager_only() const;

  explicit EagerGraphs(bool enabled) : enabled_(enabled) {}
  ~EagerGraphs();
  EagerGraphs(const EagerGraphs&) = delete;
  EagerGraphs& operator=(const EagerGraphs&) = delete;

 private:
  struct Signature {
    int addresses = 0;  // graphs captured for it (distinct operands seen)
    bool eager_only = false;
  };

  cudaGraphExec_t capture(const std::function<void(cudaStream_t)>& issue);
  void clear();

  bool enabled_;
  int64_t launches_ = 0;
  cudaStream_t capture_stream_ = nullptr;
  cudaStream_t branch_stream_ = nullptr;
  std::unordered_map<Key, Signature, KeyHash> signatures_;
  std::unordered_map<Key, cudaGraphExec_t, KeyHash> graphs_;  // signature + operands
};

}  // namespace fast_ulysses::transport
