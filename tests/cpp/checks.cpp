#include "checks.h"

#include <algorithm>

#include "cases.h"

namespace fu_test {
namespace {

using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

int hex(std::byte b) { return static_cast<int>(b); }

// Copies arriving at each rank j, summed over senders: plans[r].copies[j].
AssertionResult incoming_bytes_agree(const std::vector<fast_ulysses::Plan>& plans) {
  for (size_t j = 0; j < plans.size(); ++j) {
    int64_t incoming = 0;
    for (const auto& plan : plans) incoming += plan.copies[j].bytes();
    if (incoming != plans[j].output_bytes)
      return AssertionFailure() << "rank " << j << " receives " << incoming
                                << " bytes but its output is " << plans[j].output_bytes;
  }
  return AssertionSuccess();
}

}  // namespace

AssertionResult same_bytes(const RankBuffers& actual, const RankBuffers& expected) {
  if (actual.size() != expected.size())
    return AssertionFailure() << actual.size() << " buffers, expected " << expected.size();
  for (size_t r = 0; r < actual.size(); ++r) {
    if (actual[r].size() != expected[r].size())
      return AssertionFailure() << "rank " << r << " has " << actual[r].size()
                                << " bytes, expected " << expected[r].size();
    const auto diff = std::mismatch(actual[r].begin(), actual[r].end(), expected[r].begin());
    if (diff.first != actual[r].end())
      return AssertionFailure() << "rank " << r << " byte " << (diff.first - actual[r].begin())
                                << " of " << actual[r].size() << ": got " << hex(*diff.first)
                                << ", expected " << hex(*diff.second);
  }
  return AssertionSuccess();
}

AssertionResult plan_sizes_agree(const Case& c, const std::vector<fast_ulysses::Plan>& plans) {
  int64_t largest = 0;
  for (int r = 0; r < c.world_size(); ++r) largest = std::max(largest, reference_output_bytes(c, r));
  for (int r = 0; r < c.world_size(); ++r) {
    const auto& plan = plans[r];
    if (plan.input_bytes != reference_input_bytes(c, r) ||
        plan.output_bytes != reference_output_bytes(c, r))
      return AssertionFailure() << "rank " << r << " plan bytes in/out " << plan.input_bytes
                                << "/" << plan.output_bytes << ", reference "
                                << reference_input_bytes(c, r) << "/"
                                << reference_output_bytes(c, r);
    if (plan.window_bytes != largest)
      return AssertionFailure() << "rank " << r << " window_bytes " << plan.window_bytes
                                << ", largest output " << largest;
    if (static_cast<int>(plan.copies.size()) != c.world_size())
      return AssertionFailure() << "rank " << r << " has " << plan.copies.size() << " copies";
    for (int j = 0; j < c.world_size(); ++j)
      if (plan.copies[j].peer != j)
        return AssertionFailure() << "rank " << r << " copies[" << j << "].peer is "
                                  << plan.copies[j].peer;
  }
  return incoming_bytes_agree(plans);
}

AssertionResult every_output_byte_written(const std::vector<fast_ulysses::Plan>& plans,
                                        const Executed& executed, std::byte sentinel) {
  for (size_t j = 0; j < plans.size(); ++j) {
    const auto& window = executed.windows[j];
    const auto end = window.begin() + plans[j].output_bytes;
    const auto unwritten = std::find(window.begin(), end, sentinel);
    if (unwritten != end)
      return AssertionFailure() << "rank " << j << " output byte " << (unwritten - window.begin())
                                << " was never written";
    const auto touched = std::find_if(end, window.end(), [&](std::byte b) { return b != sentinel; });
    if (touched != window.end())
      return AssertionFailure() << "rank " << j << " window byte " << (touched - window.begin())
                                << " past output_bytes " << plans[j].output_bytes
                                << " was written";
  }
  return AssertionSuccess();
}

AssertionResult plan_matches_reference(const Case& c, uint64_t seed) {
  const auto plans = make_plans(c);
  if (auto sizes = plan_sizes_agree(c, plans); !sizes) return sizes;
  const RankBuffers inputs = make_inputs(c, seed);
  const std::byte sentinel{0};
  const Executed executed = execute_plans(plans, inputs, sentinel);
  // Exactly once: every byte is written and (plan_sizes_agree) the copies add up to the output.
  if (auto coverage = every_output_byte_written(plans, executed, sentinel); !coverage)
    return coverage;
  return same_bytes(executed.outputs, reference_all_to_all(c, inputs));
}

AssertionResult round_trips(const Case& c, uint64_t seed) {
  const RankBuffers inputs = make_inputs(c, seed);
  const RankBuffers there = run_plans(c, inputs);
  return same_bytes(run_plans(inverse(c), there), inputs);
}

}  // namespace fu_test
