// Assertions the plan tests share. Each returns a gtest AssertionResult whose failure message
// names the rank and byte at fault; callers add describe(case).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "reference.h"

namespace fu_test {

// Byte-for-byte equality of every rank's buffer.
::testing::AssertionResult same_bytes(const RankBuffers& actual, const RankBuffers& expected);

// The plans' sizes agree with the reference: input/output bytes per rank, window_bytes the same
// on every rank and equal to the largest output, one copy per peer in rank order, and the copies
// arriving at each rank add up to exactly its output bytes.
::testing::AssertionResult plan_sizes_agree(const Case& c,
                                            const std::vector<fast_ulysses::Plan>& plans);

// After execute_plans(plans, inputs, sentinel): no output byte still holds the sentinel (inputs
// never contain it) and no window byte past output_bytes was touched.
::testing::AssertionResult every_output_byte_written(const std::vector<fast_ulysses::Plan>& plans,
                                                   const Executed& executed, std::byte sentinel);

// The whole contract of one case with inputs from `seed`: sizes, executed result == reference,
// coverage.
::testing::AssertionResult plan_matches_reference(const Case& c, uint64_t seed);

// Running c and then inverse(c) on its outputs gives the inputs back, byte for byte.
::testing::AssertionResult round_trips(const Case& c, uint64_t seed);

}  // namespace fu_test
