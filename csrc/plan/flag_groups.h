// Which stream memory operations wait for, or write, one flag word per peer: pure C++17, the
// arithmetic of the transport's handshake (csrc/transport/handshake.h), kept here with the plan
// so that the host-only tests cover it.
//
// A rank's signal header holds, for each (slot, word), one 32-bit word per rank index
// 0..kMaxWorldSize-1: the word at index p is about peer p. The words at the rank's own index and
// at indices >= the group's size are idle: after the header's initial fill nobody writes them.
// With 64-bit operations, the words at indices 2i and 2i+1 (8 bytes, 8-byte aligned) are waited
// for or written with one operation whose value holds the idle word's own value, so a write
// leaves it as it was; a pair with no peer in it gets no operation. Without them, one 32-bit
// operation per peer's word.
#pragma once

#include <cstdint>
#include <vector>

namespace fast_ulysses {

struct FlagGroup {
  int first = 0;                  // rank index of its (first) word
  bool wide = false;              // two words, `first` and `first` + 1, in one 64-bit operation
  bool peer[2] = {false, false};  // whether each of the words is a peer's (else idle)

  // The operation's value when each peer word is to hold `value` and each idle word holds
  // `idle`: the word at `first` in the low half (the GPU is little-endian).
  uint64_t value(uint32_t value, uint32_t idle) const;
};

// The groups covering the word of every peer of rank `me` among `world` ranks, once each, by
// ascending index (none for world == 1). Throws std::invalid_argument unless
// 1 <= world <= kMaxWorldSize and 0 <= me < world.
std::vector<FlagGroup> flag_groups(int world, int me, bool wide);

}  // namespace fast_ulysses
