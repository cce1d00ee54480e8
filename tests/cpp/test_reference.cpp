// The reference itself, against outputs worked out by hand from docs/API.md, so that the plan tests
// measure the plan against the definition and not against a shared mistake.
#include <gtest/gtest.h>

#include <string>

#include "cases.h"
#include "checks.h"
#include "reference.h"

namespace fu_test {
namespace {

using fast_ulysses::Layout;
using fast_ulysses::Mode;

constexpr int64_t kRow = 16;  // head_dim 16 of 1-byte elements: one letter per (token, head)

// One 16-byte row per letter: "AB" -> 16 x 'A', 16 x 'B'.
Bytes rows(const std::string& letters) {
  Bytes out;
  for (char letter : letters) out.insert(out.end(), kRow, static_cast<std::byte>(letter));
  return out;
}

Case lettered(Mode mode, Layout layout, int64_t batch, std::vector<int64_t> seq,
              std::vector<int64_t> heads) {
  return Case{mode, layout, batch, kRow, 1, std::move(seq), std::move(heads)};
}

TEST(Reference, UnevenRowsBshd) {
  // Rank 0 holds token 0 (heads A B), rank 1 tokens 1, 2 (C D, E F). Rank j keeps head j.
  const Case c = lettered(Mode::kSeqToHead, Layout::kBSHD, 1, {1, 2}, {1, 1});
  const RankBuffers inputs{rows("AB"), rows("CDEF")};
  EXPECT_TRUE(same_bytes(reference_all_to_all(c, inputs), {rows("ACE"), rows("BDF")}));
  EXPECT_TRUE(same_bytes(reference_all_to_all(inverse(c), {rows("ACE"), rows("BDF")}), inputs));
}

TEST(Reference, UnevenHeads) {
  // N = 3: rank 0 keeps heads 0, 1 and rank 1 head 2. One token per rank.
  const Case c = lettered(Mode::kSeqToHead, Layout::kBSHD, 1, {1, 1}, {2, 1});
  const RankBuffers inputs{rows("ABC"), rows("DEF")};
  EXPECT_TRUE(same_bytes(reference_all_to_all(c, inputs), {rows("ABDE"), rows("CF")}));
}

TEST(Reference, BatchOfTwoBshd) {
  // Rank 0: [b0][s0] = A B, [b1][s0] = C D; rank 1: [b0][s0] = E F, [b1][s0] = G H.
  const Case c = lettered(Mode::kSeqToHead, Layout::kBSHD, 2, {1, 1}, {1, 1});
  const RankBuffers inputs{rows("ABCD"), rows("EFGH")};
  EXPECT_TRUE(same_bytes(reference_all_to_all(c, inputs), {rows("AECG"), rows("BFDH")}));
}

TEST(Reference, BatchOfTwoSbhd) {
  // The same bytes read as sbhd: rank 0: [s0][b0] = A B, [s0][b1] = C D.
  const Case c = lettered(Mode::kSeqToHead, Layout::kSBHD, 2, {1, 1}, {1, 1});
  const RankBuffers inputs{rows("ABCD"), rows("EFGH")};
  EXPECT_TRUE(same_bytes(reference_all_to_all(c, inputs), {rows("ACEG"), rows("BDFH")}));
}

TEST(Reference, UnevenRowsBhsd) {
  // bhsd: rank 0 holds row 0 of heads 0, 1 (A, B); rank 1 rows 1, 2 of head 0 (C D) and of
  // head 1 (E F). Rank j keeps head j: all three rows of it, in order.
  const Case c = lettered(Mode::kSeqToHead, Layout::kBHSD, 1, {1, 2}, {1, 1});
  const RankBuffers inputs{rows("AB"), rows("CDEF")};
  EXPECT_TRUE(same_bytes(reference_all_to_all(c, inputs), {rows("ACD"), rows("BEF")}));
  EXPECT_TRUE(same_bytes(reference_all_to_all(inverse(c), {rows("ACD"), rows("BEF")}), inputs));
}

TEST(Reference, BatchOfTwoBhsd) {
  // Rank 0 [b][h][s]: b0h0 = A B, b0h1 = C D, b1h0 = E F, b1h1 = G H; rank 1 (one row): I J K L.
  const Case c = lettered(Mode::kSeqToHead, Layout::kBHSD, 2, {2, 1}, {1, 1});
  const RankBuffers inputs{rows("ABCDEFGH"), rows("IJKL")};
  EXPECT_TRUE(same_bytes(reference_all_to_all(c, inputs), {rows("ABIEFK"), rows("CDJGHL")}));
}

TEST(Reference, ZeroRowsAndZeroHeads) {
  // Rank 1 holds no token and keeps no head: its input and output are empty.
  const Case c = lettered(Mode::kSeqToHead, Layout::kBSHD, 1, {2, 0}, {2, 0});
  const RankBuffers inputs{rows("ABCD"), Bytes{}};
  EXPECT_TRUE(same_bytes(reference_all_to_all(c, inputs), {rows("ABCD"), Bytes{}}));
}

TEST(Reference, ModeOneUndoesModeZero) {
  for (int P : {1, 3, 8})
    for (Layout layout : {Layout::kBSHD, Layout::kSBHD, Layout::kBHSD})
      for (const Case& c : exhaustive_cases(P, Mode::kSeqToHead, layout)) {
        const RankBuffers inputs = make_inputs(c, 7);
        const RankBuffers there = reference_all_to_all(c, inputs);
        ASSERT_TRUE(same_bytes(reference_all_to_all(inverse(c), there), inputs)) << describe(c);
      }
}

}  // namespace
}  // namespace fu_test
