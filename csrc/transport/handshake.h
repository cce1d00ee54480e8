// Zero-SM, replay-safe handshake: 32-bit flag words in the symmetric heap, written and awaited
// with stream memory operations batched into cuStreamBatchMemOp. No kernel is ever launched.
//
// Flags only ever hold the constants 0 and 1, never a host counter, so a CUDA graph that
// captured a call replays it correctly any number of times, mixed with eager calls (the
// protocol and its safety argument: docs/DESIGN.md, "The handshake").
//
// Every rank's header holds, per tag slot, three words per peer p:
//   kHeld[slot][p]       1 while p's window holds data I wrote (or, initially, "call 0"); set by
//                        me after I acquired p's window, overwritten by p with its call's
//                        signature (plan/call_signature.h) when it releases the window at the
//                        start of its next call on the tag. I write into p's window only once
//                        this word holds my own call's signature (then I set it back to 1).
//   kHeldOwned[slot][p]  1 while p has yet to copy an owned result (what I wrote) out of its
//                        window: set by me with kHeld, for an owned call; cleared to 0 by p on
//                        its communication stream once it has copied the window out, so the
//                        release never depends on work that a graph launched on another stream
//                        is not ordered after.
//   kLanded[slot][p]     1 once p's chunk has landed in my window; set by p after its copy (a
//                        fenced write on the copy's stream), waited and reset to 0 by me.
// The barrier slot uses kBarrierA and kBarrierB: a barrier is two full rounds, so a fast peer's
// next barrier can never write a flag that a slow peer has not yet reset.
//
// A rank waits for and writes its own words about its peers two at a time where the GPU takes
// 64-bit memory operations (plan/flag_groups.h; elsewhere one 32-bit operation a flag): the
// words of peers 2i and 2i+1 are adjacent, and each is written by its peer only after the rank
// itself reset or set it, so one operation over both is the two operations in one.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "plan/flag_groups.h"
#include "plan/plan.h"
#include "plan/tag_rules.h"

namespace fast_ulysses::transport {

enum class Word { kHeld = 0, kHeldOwned = 1, kLanded = 2, kBarrierA = 0, kBarrierB = 1 };

// Stream memory operations collected on the host, issued with as few driver calls as possible
// (cuStreamBatchMemOp takes fewer than 256 ops per call), in order.
class MemOpBatch {
 public:
  // A 32-bit operation on the word at `address`, or with `wide` a 64-bit one on the two words
  // there (8-byte aligned).
  void write(char* address, uint64_t value, bool wide = false);
  void wait_equal(char* address, uint64_t value, bool wide = false);
  // Issues every op on `stream` in the order added, then empties the batch.
  void issue(cudaStream_t stream);
  bool empty() const { return ops_.empty(); }

 private:
  std::vector<CUstreamBatchMemOpParams> ops_;
};

class Handshake {
 public:
  static constexpr int kMaxTags = fast_ulysses::kMaxTags;  // plan/tag_rules.h
  static constexpr int kBarrierSlot = kMaxTags;            // the slot of group.barrier()
  static constexpr int kMaxRanks = kMaxWorldSize;          // plan.h's limit
  static constexpr int kWords = 3;
  // Bytes of the signal header at the start of every rank's pool: slots x words x ranks.
  static constexpr int64_t kHeaderBytes = int64_t{kMaxTags + 1} * kWords * kMaxRanks * 4;

  // The header's contents before any call: kHeld = 1 for every tag slot and peer (as if a call 0
  // had written every window), everything else 0. Written before the pool's rendezvous.
  static std::vector<uint32_t> initial_header();
  // The value of word (slot, word) in that initial header: what an idle word (this rank's own,
  // or a rank index past the group's size) holds forever.
  static uint32_t initial_value(int slot, Word word);

  // `headers[p]` is rank p's signal header as this rank addresses it. `wide`: wait for and
  // write my words about my peers with 64-bit operations, two peers' words each.
  Handshake(int rank, std::vector<char*> headers, bool wide);

  int rank() const { return rank_; }
  int world_size() const { return static_cast<int>(headers_.size()); }
  bool wide() const { return wide_; }
  // Adds to `batch`: wait until my word (slot, word) about every peer holds `value`.
  void wait_peers(MemOpBatch& batch, int slot, Word word, uint32_t value) const;
  // Adds to `batch`: write `value` into my word (slot, word) about every peer.
  void set_peers(MemOpBatch& batch, int slot, Word word, uint32_t value) const;
  // My word (slot, word) about peer `from`.
  char* mine(int slot, Word word, int from) const;
  // Peer `to`'s word (slot, word) about me.
  char* theirs(int to, int slot, Word word) const;
  // Host read of a word at its device address (for the watchdog): a blocking copy on a stream
  // of its own; false (value untouched) if CUDA refused it.
  static bool read_word(const char* word, uint32_t* value);

 private:
  static int64_t offset(int slot, Word word, int rank);
  int rank_;
  std::vector<char*> headers_;
  bool wide_;
  std::vector<FlagGroup> groups_;  // my words about my peers, as operations (flag_groups.h)
};

}  // namespace fast_ulysses::transport
