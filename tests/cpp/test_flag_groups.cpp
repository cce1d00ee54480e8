// The handshake's flag operations (csrc/plan/flag_groups.h): every peer's word covered once,
// idle words never claimed as a peer's, pairs 8-byte aligned, and the values an operation
// carries for its peer and idle halves.
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "plan/flag_groups.h"
#include "plan/plan.h"

namespace fu_test {
namespace {

using fast_ulysses::flag_groups;
using fast_ulysses::FlagGroup;
using fast_ulysses::kMaxWorldSize;

TEST(FlagGroups, EveryPeerWordOnceAndNoOtherWord) {
  for (bool wide : {false, true})
    for (int world = 1; world <= kMaxWorldSize; ++world)
      for (int me = 0; me < world; ++me) {
        std::vector<int> covered(kMaxWorldSize + 1, 0);
        int last = -1;
        for (const FlagGroup& g : flag_groups(world, me, wide)) {
          EXPECT_EQ(g.wide, wide) << "world " << world << " me " << me;
          EXPECT_GT(g.first, last) << "ascending, world " << world << " me " << me;
          last = g.first;
          if (wide) {
            EXPECT_EQ(g.first % 2, 0) << "a 64-bit pair starts at an even index";
          }
          EXPECT_TRUE(g.peer[0] || g.peer[1]) << "a group without a peer, at " << g.first;
          for (int half = 0; half < (wide ? 2 : 1); ++half) {
            const int index = g.first + half;
            const bool peer = index < world && index != me;
            EXPECT_EQ(g.peer[half], peer)
                << "world " << world << " me " << me << " index " << index;
            if (g.peer[half]) ++covered[index];
          }
        }
        for (int p = 0; p < world; ++p)
          EXPECT_EQ(covered[p], p == me ? 0 : 1)
              << "word of rank " << p << ", world " << world << " me " << me;
      }
}

TEST(FlagGroups, OperationCounts) {
  EXPECT_TRUE(flag_groups(1, 0, true).empty());
  EXPECT_EQ(flag_groups(8, 3, false).size(), 7u);  // one 32-bit operation per peer
  EXPECT_EQ(flag_groups(8, 3, true).size(), 4u);   // pairs (0,1) (2, 3 = me) (4,5) (6,7)
  EXPECT_EQ(flag_groups(2, 0, true).size(), 1u);   // (me, peer)
  EXPECT_EQ(flag_groups(3, 0, true).size(), 2u);   // (me, 1), (2, idle)
  EXPECT_EQ(flag_groups(5, 4, true).size(), 2u);   // (0,1) (2,3); (4 = me, idle) has no peer
}

TEST(FlagGroups, ValuesHoldIdleWordsAsTheyAre) {
  // world 3, me 0, wide: (0 = me, 1 = peer) then (2 = peer, 3 = idle).
  const auto groups = flag_groups(3, 0, true);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].value(1, 0), uint64_t{1} << 32);  // low half: my own (idle) word
  EXPECT_EQ(groups[0].value(0, 1), uint64_t{1});        // idle 1 stays 1, the peer's 0
  EXPECT_EQ(groups[1].value(1, 0), uint64_t{1});
  EXPECT_EQ(groups[1].value(1, 1), uint64_t{0x100000001});
  const auto both = flag_groups(4, 3, true);  // (0,1) both peers
  EXPECT_EQ(both[0].value(1, 0), uint64_t{0x100000001});
  EXPECT_EQ(both[0].value(0, 1), uint64_t{0});
  const auto narrow = flag_groups(4, 3, false);
  EXPECT_EQ(narrow[0].value(1, 0), uint64_t{1});  // one 32-bit word: the value alone
}

TEST(FlagGroups, RefusesRanksOutsideTheGroup) {
  EXPECT_THROW(flag_groups(0, 0, true), std::invalid_argument);
  EXPECT_THROW(flag_groups(kMaxWorldSize + 1, 0, true), std::invalid_argument);
  EXPECT_THROW(flag_groups(4, 4, false), std::invalid_argument);
  EXPECT_THROW(flag_groups(4, -1, false), std::invalid_argument);
}

}  // namespace
}  // namespace fu_test
