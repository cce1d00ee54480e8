// The cases the plan tests walk: a fixed exhaustive grid, a seeded random generator, and the
// input bytes (never zero, so a window poisoned with 0 shows every byte nobody wrote).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "reference.h"

namespace fu_test {

// Split patterns of length P: even, uneven, with zero entries, everything on the last rank.
// Every pattern has a positive total (for P = 1 all of them are a single positive entry).
std::vector<std::vector<int64_t>> split_patterns(int world_size);

// Every (seq pattern, head pattern, element size 1/2/4, head_dim 1, 3 and 48 bytes' worth,
// batch 1/2/3) for one P, mode and layout: rows of odd byte widths included.
std::vector<Case> exhaustive_cases(int world_size, fast_ulysses::Mode mode,
                                   fast_ulysses::Layout layout);

// A random valid case: P in 1..8, splits in 0..5 (some zero, positive totals), b in 1..3,
// element size 1/2/4, d a multiple of 16 / element_size or any d in 1..7, random layout
// (bshd, sbhd, bhsd) and mode.
Case random_case(std::mt19937_64& rng);

// Rank r's input: pseudo-random bytes in 1..255 that depend on (seed, r, byte index).
RankBuffers make_inputs(const Case& c, uint64_t seed);

// The same call in the other direction: mode 0 <-> mode 1, same splits.
Case inverse(const Case& c);

}  // namespace fu_test
