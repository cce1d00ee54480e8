// The owned-result path: this rank's own chunk straight from its input into the result, and the
// plan's `collect` copies bring the peers' chunks from the window. Together they must give the
// reference output byte for byte, and `collect` must never read or write my own chunk's bytes
// (the transport writes those on another stream).
#include <gtest/gtest.h>

#include <random>

#include "cases.h"
#include "plan/host_executor.h"
#include "printers.h"
#include "reference.h"

namespace fu_test {
namespace {

using fast_ulysses::Plan;

// Rank r's owned result: own chunk from the input, then collect from the executed window.
// Bytes nobody wrote keep `sentinel` (inputs never contain it).
Bytes owned_result(const Plan& plan, const Bytes& input, const Bytes& window, std::byte sentinel) {
  Bytes out(plan.output_bytes, sentinel);
  const int r = plan.request.rank;
  fast_ulysses::execute_on_host(plan.copies[r], input.data(), plan.input_bytes, out.data(),
                                plan.output_bytes);
  for (const auto& copy : plan.collect)
    fast_ulysses::execute_on_host(copy, window.data(), plan.window_bytes, out.data(),
                                  plan.output_bytes);
  return out;
}

::testing::AssertionResult owned_matches_reference(const Case& c, uint64_t seed) {
  const RankBuffers inputs = make_inputs(c, seed);
  const auto plans = make_plans(c);
  const Executed executed = execute_plans(plans, inputs, std::byte{0});
  const RankBuffers expected = reference_all_to_all(c, inputs);
  for (int r = 0; r < c.world_size(); ++r) {
    const Plan& plan = plans[r];
    if (plan.collect.size() > 2)
      return ::testing::AssertionFailure() << "rank " << r << ": " << plan.collect.size()
                                           << " collect copies, at most 2";
    int64_t collected = 0;
    for (const auto& copy : plan.collect) collected += copy.bytes();
    if (collected + plan.copies[r].bytes() != plan.output_bytes)
      return ::testing::AssertionFailure()
             << "rank " << r << ": collect moves " << collected << " bytes + own chunk "
             << plan.copies[r].bytes() << " != output " << plan.output_bytes;
    // A window whose own-chunk bytes are poisoned: collect must not carry them into the result.
    Bytes window = executed.windows[r];
    fast_ulysses::execute_on_host(plan.copies[r], Bytes(plan.input_bytes, std::byte{0}).data(),
                                  plan.input_bytes, window.data(), plan.window_bytes);
    const Bytes out = owned_result(plan, inputs[r], window, std::byte{0});
    if (out != expected[r]) {
      int64_t first = 0;
      while (first < plan.output_bytes && out[first] == expected[r][first]) ++first;
      return ::testing::AssertionFailure() << "rank " << r << ": owned result differs from the "
                                           << "reference at byte " << first;
    }
  }
  return ::testing::AssertionSuccess();
}

TEST(Collect, ExhaustiveSmallCases) {
  for (int P = 1; P <= 5; ++P)
    for (auto mode : {fast_ulysses::Mode::kSeqToHead, fast_ulysses::Mode::kHeadToSeq})
      for (auto layout : {fast_ulysses::Layout::kBSHD, fast_ulysses::Layout::kSBHD})
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
