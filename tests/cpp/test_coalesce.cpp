// coalesced(): the same copy with dense dimensions merged. Checked against a naive executor
// written from the CopyDescriptor definition (z, y loops of `width` bytes), on random
// descriptors, dense and padded, and on the descriptors of real plans.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <tuple>

#include "cases.h"
#include "checks.h"
#include "plan/host_executor.h"
#include "plan/plan.h"
#include "reference.h"

namespace fu_test {
namespace {

using fast_ulysses::coalesced;
using fast_ulysses::CopyDescriptor;

// The definition: for z < depth, y < height, copy width bytes at the pitched offsets.
void naive_execute(const CopyDescriptor& c, const Bytes& src, Bytes& dst) {
  for (int64_t z = 0; z < c.depth; ++z)
    for (int64_t y = 0; y < c.height; ++y)
      std::memcpy(dst.data() + c.dst_offset + z * c.dst_slice_pitch + y * c.dst_pitch,
                  src.data() + c.src_offset + z * c.src_slice_pitch + y * c.src_pitch,
                  static_cast<size_t>(c.width));
}

// Rows dense or padded on each side, slices abutting or padded: every merge rule gets its turn.
CopyDescriptor random_descriptor(std::mt19937_64& rng) {
  const auto pick = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  CopyDescriptor c;
  c.width = pick(1, 48);
  c.height = pick(1, 5);
  c.depth = pick(1, 4);
  c.src_offset = pick(0, 40);
  c.dst_offset = pick(0, 40);
  c.src_pitch = c.width + (rng() % 2 ? 0 : pick(1, 16));
  c.dst_pitch = c.width + (rng() % 2 ? 0 : pick(1, 16));
  c.src_slice_pitch = c.height * c.src_pitch + (rng() % 2 ? 0 : pick(1, 32));
  c.dst_slice_pitch = c.height * c.dst_pitch + (rng() % 2 ? 0 : pick(1, 32));
  return c;
}

Bytes random_bytes(std::mt19937_64& rng, int64_t n) {
  Bytes out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() % 255 + 1);
  return out;
}

::testing::AssertionResult same_copy(const CopyDescriptor& raw, std::mt19937_64& rng) {
  const CopyDescriptor merged = coalesced(raw);
  if (merged.bytes() != raw.bytes() || merged.src_extent() > raw.src_extent() ||
      merged.dst_extent() > raw.dst_extent())
    return ::testing::AssertionFailure() << "bytes or extents grew";
  const Bytes src = random_bytes(rng, raw.src_extent());
  Bytes expected(raw.dst_extent() + 8, std::byte{0}), via_merged = expected, via_host = expected;
  naive_execute(raw, src, expected);
  naive_execute(merged, src, via_merged);
  fast_ulysses::execute_on_host(raw, src.data(), static_cast<int64_t>(src.size()), via_host.data(),
                                static_cast<int64_t>(via_host.size()));
  if (auto r = same_bytes({via_merged}, {expected}); !r) return r << " (coalesced, naive)";
  if (auto r = same_bytes({via_host}, {expected}); !r) return r << " (execute_on_host)";
  return ::testing::AssertionSuccess();
}

TEST(Coalesced, RandomDescriptorsMoveTheSameBytes) {
  std::mt19937_64 rng(31337);
  for (int k = 0; k < 20000; ++k) {
    const CopyDescriptor raw = random_descriptor(rng);
    ASSERT_TRUE(same_copy(raw, rng))
        << "case " << k << ": width " << raw.width << " height " << raw.height << " depth "
        << raw.depth << " pitches " << raw.src_pitch << "/" << raw.dst_pitch << " slices "
        << raw.src_slice_pitch << "/" << raw.dst_slice_pitch;
  }
}

TEST(Coalesced, IsIdempotent) {
  std::mt19937_64 rng(4);
  for (int k = 0; k < 2000; ++k) {
    CopyDescriptor raw = random_descriptor(rng);
    raw.peer = k % 8;
    const CopyDescriptor once = coalesced(raw);
    const CopyDescriptor twice = coalesced(once);
    // Every field of the descriptor, so a rule that re-fires on its own output shows.
    const auto fields = [](const CopyDescriptor& c) {
      return std::make_tuple(c.peer, c.src_offset, c.dst_offset, c.width, c.height, c.depth,
                             c.src_pitch, c.dst_pitch, c.src_slice_pitch, c.dst_slice_pitch);
    };
    ASSERT_EQ(fields(twice), fields(once)) << "case " << k;
  }
}

TEST(Coalesced, DenseBecomesOneDimensional) {
  CopyDescriptor dense;
  dense.width = 16;
  dense.height = 3;
  dense.depth = 2;
  dense.src_pitch = dense.dst_pitch = 16;
  dense.src_slice_pitch = dense.dst_slice_pitch = 48;
  const CopyDescriptor merged = coalesced(dense);
  EXPECT_EQ(merged.width, 96);
  EXPECT_EQ(merged.height, 1);
  EXPECT_EQ(merged.depth, 1);
}

TEST(Coalesced, OneRowPerSliceBecomesRows) {
  CopyDescriptor copy;
  copy.width = 32;
  copy.height = 1;
  copy.depth = 4;
  copy.src_slice_pitch = 64;
  copy.dst_slice_pitch = 96;
  const CopyDescriptor merged = coalesced(copy);
  EXPECT_EQ(merged.height, 4);
  EXPECT_EQ(merged.depth, 1);
  EXPECT_EQ(merged.src_pitch, 64);
  EXPECT_EQ(merged.dst_pitch, 96);
}

TEST(Coalesced, PlansOfOneRankAreOneFlatCopy) {
  using fast_ulysses::Layout;
  using fast_ulysses::Mode;
  for (Mode mode : {Mode::kSeqToHead, Mode::kHeadToSeq})
    for (Layout layout : {Layout::kBSHD, Layout::kSBHD, Layout::kBHSD})
      for (const Case& c : exhaustive_cases(1, mode, layout)) {
        const CopyDescriptor merged = coalesced(make_plans(c)[0].copies[0]);
        EXPECT_EQ(merged.height, 1) << describe(c);
        EXPECT_EQ(merged.depth, 1) << describe(c);
      }
}

// bhsd: when my rows are all the rows (the peer holds none), a chunk's heads abut on both sides:
// one flat run per batch element, and with b = 1 one flat copy.
TEST(Coalesced, BhsdHeadsThatAbutMerge) {
  using fast_ulysses::Layout;
  using fast_ulysses::Mode;
  for (int64_t batch : {1, 3}) {
    const Case c{Mode::kSeqToHead, Layout::kBHSD, batch, 3, 4, {4, 0}, {2, 2}};
    const CopyDescriptor copy = make_plans(c)[0].copies[1];  // heads 2, 3 of my 4 rows
    EXPECT_EQ(copy.height, 2);
    const CopyDescriptor merged = coalesced(copy);
    EXPECT_EQ(merged.width, 2 * 4 * 12) << describe(c);
    EXPECT_EQ(merged.height, batch) << describe(c);  // slices do not abut at the source
    EXPECT_EQ(merged.depth, 1) << describe(c);
    EXPECT_EQ(merged.bytes(), copy.bytes());
  }
}

TEST(Coalesced, EmptyCopyIsLeftAlone) {
  CopyDescriptor empty;
  empty.width = 16;
  empty.depth = 3;
  const CopyDescriptor merged = coalesced(empty);
  EXPECT_EQ(merged.bytes(), 0);
  EXPECT_EQ(merged.src_extent(), 0);
  EXPECT_EQ(merged.dst_extent(), 0);
}

}  // namespace
}  // namespace fu_test
