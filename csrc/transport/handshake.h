// Zero-SM handshake: 64-bit signal words in the symmetric heap, written and awaited with stream
// memory operations (cuStreamWriteValue64 / cuStreamWaitValue64). No kernel is ever launched.
//
// Every rank's signal header holds, per tag slot, two words per sending rank:
//   kConsumed[slot][j]  rank j has finished reading its window for `slot` up to epoch e
//                       (written by j into every rank's header; a sender waits on it locally
//                       before writing epoch e + 1 into j's window);
//   kLanded[slot][i]    rank i's chunk of epoch e has landed in my window (written by i into my
//                       header after its copy, stream-ordered; I wait on it locally).
// One extra slot carries group.barrier(). Epochs only grow, so nothing is ever reset, and a wait
// is `word >= epoch` (GEQ).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

namespace fast_ulysses::transport {

enum class Signal { kConsumed = 0, kLanded = 1 };

class Handshake {
 public:
  static constexpr int kMaxTags = 256;
  static constexpr int kBarrierSlot = kMaxTags;  // the slot of group.barrier()
  static constexpr int kMaxRanks = 8;
  // Bytes of the signal header at the start of every rank's pool: slots x signals x ranks.
  static constexpr int64_t kHeaderBytes = int64_t{kMaxTags + 1} * 2 * kMaxRanks * 8;

  // `headers[p]` is rank p's signal header as this rank addresses it.
  Handshake(int rank, std::vector<char*> headers);

  // Stream-ordered after all prior work on `stream`, with a memory fence, so the bytes copied
  // before it are visible to whoever sees the new value.
  void signal(cudaStream_t stream, int to_rank, int slot, Signal signal, uint64_t epoch) const;
  // `stream` proceeds once my word (slot, signal, from_rank) >= epoch.
  void wait(cudaStream_t stream, int slot, Signal signal, int from_rank, uint64_t epoch) const;
  // Host read of my word (for the watchdog): a blocking copy on its own stream.
  uint64_t read(int slot, Signal signal, int from_rank) const;

 private:
  static int64_t offset(int slot, Signal signal, int rank);
  int rank_;
  std::vector<char*> headers_;
};

}  // namespace fast_ulysses::transport
