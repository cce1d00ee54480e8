// The owned-result path: this rank's own chunk straight from its input into the result, and the
// plan's `collect` copies bring the peers' chunks from the window. Together they must give the
// reference output byte for byte, and `collect` must never read or write my own chunk's bytes
// (the transport writes those on another stream).
#include <gtest/gtest.h>

#include <random>

#include "cases.h"
#include "checks.h"
#include "printers.h"
#include "reference.h"

namespace fu_test {
namespace {

TEST(Collect, ExhaustiveSmallCases) {
  for (int P = 1; P <= 5; ++P)
    for (auto mode : {fast_ulysses::Mode::kSeqToHead, fast_ulysses::Mode::kHeadToSeq})
      for (auto layout :
           {fast_ulysses::Layout::kBSHD, fast_ulysses::Layout::kSBHD, fast_ulysses::Layout::kBHSD})
        for (const Case& c : exhaustive_cases(P, mode, layout))
          ASSERT_TRUE(owned_matches_reference(c, 7)) << describe(c);
}

TEST(Collect, SeededRandomCases) {
  std::mt19937_64 rng(20261203);
  for (int i = 0; i < 2000; ++i) {
    const Case c = random_case(rng);
    ASSERT_TRUE(owned_matches_reference(c, i)) << describe(c);
  }
}

TEST(Collect, SingleRankCollectsNothing) {
  Case c;
  c.seq_splits = {6};
  c.head_splits = {4};
  for (auto mode : {fast_ulysses::Mode::kSeqToHead, fast_ulysses::Mode::kHeadToSeq}) {
    c.mode = mode;
    EXPECT_TRUE(make_plans(c)[0].collect.empty()) << describe(c);
  }
}

}  // namespace
}  // namespace fu_test
