// The plan, executed on host buffers, against the reference: an exhaustive grid, 10,000 seeded
// random cases, and mode 0 <-> mode 1 round trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cases.h"
#include "checks.h"
#include "printers.h"
#include "reference.h"

namespace fu_test {
namespace {

using fast_ulysses::Layout;
using fast_ulysses::Mode;

std::string layout_tag(Layout layout) {
  return fast_ulysses::layout_name(layout);
}

// --- Exhaustive: P 1..8 x mode x layout, each over every split pattern, element size, row
// size and batch of exhaustive_cases(). ---

class Exhaustive : public ::testing::TestWithParam<std::tuple<int, Mode, Layout>> {};

TEST_P(Exhaustive, MatchesReference) {
  const auto [P, mode, layout] = GetParam();
  const auto cases = exhaustive_cases(P, mode, layout);
  ASSERT_EQ(cases.size(), 4u * 4u * 3u * 3u * 3u);
  uint64_t seed = 1;
  for (const Case& c : cases) ASSERT_TRUE(plan_matches_reference(c, seed++)) << describe(c);
}

INSTANTIATE_TEST_SUITE_P(AllWorldSizes, Exhaustive,
                         ::testing::Combine(::testing::Range(1, fast_ulysses::kMaxWorldSize + 1),
                                            ::testing::Values(Mode::kSeqToHead, Mode::kHeadToSeq),
                                            ::testing::Values(Layout::kBSHD, Layout::kSBHD,
                                                              Layout::kBHSD)),
                         [](const auto& info) {
                           return "P" + std::to_string(std::get<0>(info.param)) + "_mode" +
                                  std::to_string(static_cast<int>(std::get<1>(info.param))) + "_" +
                                  layout_tag(std::get<2>(info.param));
                         });

// --- Round trips: mode 0 then mode 1 (and the other way) give the input back exactly. ---

class RoundTrip : public ::testing::TestWithParam<std::tuple<int, Layout>> {};

TEST_P(RoundTrip, InverseModeRestoresInput) {
  const auto [P, layout] = GetParam();
  uint64_t seed = 1000;
  for (Mode first : {Mode::kSeqToHead, Mode::kHeadToSeq})
    for (const Case& c : exhaustive_cases(P, first, layout))
      ASSERT_TRUE(round_trips(c, seed++)) << describe(c) << " then its inverse";
}

INSTANTIATE_TEST_SUITE_P(AllWorldSizes, RoundTrip,
                         ::testing::Combine(::testing::Range(1, fast_ulysses::kMaxWorldSize + 1),
                                            ::testing::Values(Layout::kBSHD, Layout::kSBHD,
                                                              Layout::kBHSD)),
                         [](const auto& info) {
                           return "P" + std::to_string(std::get<0>(info.param)) + "_" +
                                  layout_tag(std::get<1>(info.param));
                         });

// --- Randomized: 10,000 cases from one fixed seed, each also round-tripped. The case list is
// generated in full and dealt to 4 shards, so ctest -j can run them side by side. ---

constexpr int kRandomCases = 10000;
constexpr int kShards = 4;

const std::vector<Case>& random_cases() {
  static const std::vector<Case> cases = [] {
    std::mt19937_64 rng(20250611);
    std::vector<Case> all;
    for (int k = 0; k < kRandomCases; ++k) all.push_back(random_case(rng));
    return all;
  }();
  return cases;
}

class Randomized : public ::testing::TestWithParam<int> {};

TEST_P(Randomized, MatchesReferenceAndRoundTrips) {
  for (int k = GetParam(); k < kRandomCases; k += kShards) {
    const Case& c = random_cases()[k];
    ASSERT_TRUE(plan_matches_reference(c, k)) << "case " << k << ": " << describe(c);
    ASSERT_TRUE(round_trips(c, k)) << "case " << k << ": " << describe(c) << " then its inverse";
  }
}

INSTANTIATE_TEST_SUITE_P(Shards, Randomized, ::testing::Range(0, kShards));

TEST(RandomCases, CoverTheSpace) {
  const auto has_zero = [](const std::vector<int64_t>& v) {
    return std::count(v.begin(), v.end(), 0) > 0;
  };
  std::vector<int> per_world_size(fast_ulysses::kMaxWorldSize + 1, 0);
  int with_zero = 0, sbhd = 0, bhsd = 0, odd_rows = 0, mode1 = 0;
  for (const Case& c : random_cases()) {
    ++per_world_size[c.world_size()];
    with_zero += has_zero(c.seq_splits) || has_zero(c.head_splits);
    sbhd += c.layout == Layout::kSBHD;
    bhsd += c.layout == Layout::kBHSD;
    odd_rows += (c.head_dim * c.element_size) % 16 != 0;
    mode1 += c.mode == Mode::kHeadToSeq;
  }
  for (int P = 1; P <= fast_ulysses::kMaxWorldSize; ++P) EXPECT_GT(per_world_size[P], 1000) << P;
  EXPECT_GT(with_zero, kRandomCases / 10);
  EXPECT_GT(sbhd, kRandomCases / 4);
  EXPECT_GT(bhsd, kRandomCases / 4);
  EXPECT_GT(odd_rows, kRandomCases / 4);
  EXPECT_GT(mode1, kRandomCases / 3);
}

// --- The harness: inputs never hold the sentinel 0, so coverage checks mean something. ---

TEST(Harness, InputsHaveNoZeroBytes) {
  const Case c{Mode::kSeqToHead, Layout::kBSHD, 3, 16, 1, {5, 7, 0}, {4, 4, 4}};
  for (const Bytes& input : make_inputs(c, 42))
    EXPECT_EQ(std::count(input.begin(), input.end(), std::byte{0}), 0);
}

}  // namespace
}  // namespace fu_test
