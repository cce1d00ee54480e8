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

// The owned-result path of every rank: its own chunk straight from its input into the result,
// then the plan's `collect` copies from the executed window, must give the reference output byte
// for byte; collect is at most two copies and never carries the window's own-chunk bytes (they
// are poisoned before collecting: the transport writes them on another stream).
::testing::AssertionResult owned_matches_reference(const Case& c, uint64_t seed);

// The contract checked by arithmetic alone, for cases too large to materialise (sizes up to the
// 2^50-byte limit): plan_sizes_agree; every copy inside its source and destination buffers
// (computed in 128 bits); the copies arriving at each rank, and each rank's own chunk plus its
// collect copies, tile the output exactly once; coalesced() keeps every copy's bytes and never
// grows its extents; and `samples` random output bytes per rank are written by exactly one copy
// from the byte reference_source_of() names.
::testing::AssertionResult plans_cover_exactly_once(const Case& c,
                                                    const std::vector<fast_ulysses::Plan>& plans,
                                                    uint64_t seed, int samples);

// Running c and then inverse(c) on its outputs gives the inputs back, byte for byte.
::testing::AssertionResult round_trips(const Case& c, uint64_t seed);

}  // namespace fu_test
