// Shapes and byte counts of real workloads, computed by hand, and request_from_shape() agreeing
// with the explicit request it abbreviates.
#include <gtest/gtest.h>

#include <array>
#include <optional>
#include <random>
#include <tuple>

#include "cases.h"
#include "printers.h"
#include "reference.h"

namespace fu_test {
namespace {

using fast_ulysses::Layout;
using fast_ulysses::Mode;
using fast_ulysses::Plan;
using Shape = std::array<int64_t, 4>;

// Wan 2.1 14B at 720p on 8 ranks: 75,600 tokens (9,450 per rank), 40 heads (5 per rank),
// d = 128, bf16. One head-row is 256 bytes.
constexpr int64_t kWanRowsPerRank = 9450, kWanTokens = 75600, kWanHeads = 40, kWanDim = 128;
constexpr int64_t kWanChunkBytes = 12'096'000;   // 9450 rows x 5 heads x 256 bytes
constexpr int64_t kWanWindowBytes = 96'768'000;  // 75600 x 5 x 256 = 9450 x 40 x 256

Case wan_720p(Mode mode, Layout layout) {
  return Case{mode,
              layout,
              1,
              kWanDim,
              2,
              std::vector<int64_t>(8, kWanRowsPerRank),
              std::vector<int64_t>(8, kWanHeads / 8)};
}

Shape in_layout(Layout layout, int64_t seq, int64_t heads) {
  if (layout == Layout::kSBHD) return Shape{seq, 1, heads, kWanDim};
  if (layout == Layout::kBHSD) return Shape{1, heads, seq, kWanDim};
  return Shape{1, seq, heads, kWanDim};
}

class Wan720p : public ::testing::TestWithParam<std::tuple<Mode, Layout>> {};

TEST_P(Wan720p, ShapesAndBytes) {
  const auto [mode, layout] = GetParam();
  const Shape rows = in_layout(layout, kWanRowsPerRank, kWanHeads);
  const Shape heads = in_layout(layout, kWanTokens, kWanHeads / 8);
  const bool to_heads = mode == Mode::kSeqToHead;
  for (const Plan& plan : make_plans(wan_720p(mode, layout))) {
    EXPECT_EQ(plan.input_shape, to_heads ? rows : heads);
    EXPECT_EQ(plan.output_shape, to_heads ? heads : rows);
    EXPECT_EQ(plan.input_bytes, kWanWindowBytes);
    EXPECT_EQ(plan.output_bytes, kWanWindowBytes);
    EXPECT_EQ(plan.window_bytes, kWanWindowBytes);
    ASSERT_EQ(plan.copies.size(), 8u);
    for (const auto& copy : plan.copies) EXPECT_EQ(copy.bytes(), kWanChunkBytes);
  }
}

TEST(Wan720pStrides, ModeZero) {
  for (Layout layout : {Layout::kBSHD, Layout::kSBHD}) {  // b = 1: both layouts agree
    const Plan plan = fast_ulysses::make_plan(request_for(wan_720p(Mode::kSeqToHead, layout), 3));
    const auto& copy = plan.copies[6];  // rank 3's 9450 rows, heads 30..34, for rank 6
    EXPECT_EQ(copy.width, 5 * 256);
    EXPECT_EQ(copy.height, kWanRowsPerRank);
    EXPECT_EQ(copy.depth, 1);
    EXPECT_EQ(copy.src_offset, 30 * 256);
    EXPECT_EQ(copy.src_pitch, kWanHeads * 256);
    EXPECT_EQ(copy.dst_offset, 3 * kWanChunkBytes);  // after the rows of ranks 0..2
    EXPECT_EQ(copy.dst_pitch, 5 * 256);
  }
}

TEST(Wan720pStrides, ModeOne) {
  for (Layout layout : {Layout::kBSHD, Layout::kSBHD}) {
    const Plan plan = fast_ulysses::make_plan(request_for(wan_720p(Mode::kHeadToSeq, layout), 3));
    const auto& copy = plan.copies[6];  // rows of rank 6 of my heads 15..19, for rank 6
    EXPECT_EQ(copy.width, 5 * 256);
    EXPECT_EQ(copy.height, kWanRowsPerRank);
    EXPECT_EQ(copy.src_offset, 6 * kWanChunkBytes);
    EXPECT_EQ(copy.src_pitch, 5 * 256);
    EXPECT_EQ(copy.dst_offset, 15 * 256);
    EXPECT_EQ(copy.dst_pitch, kWanHeads * 256);
  }
}

// bhsd: a chunk is, per head, one run of rows; 5 heads of rank 3's 9450 rows for rank 6.
TEST(Wan720pStrides, BhsdModeZero) {
  const Plan plan =
      fast_ulysses::make_plan(request_for(wan_720p(Mode::kSeqToHead, Layout::kBHSD), 3));
  const auto& copy = plan.copies[6];
  EXPECT_EQ(copy.width, kWanRowsPerRank * 256);
  EXPECT_EQ(copy.height, 5);
  EXPECT_EQ(copy.depth, 1);
  EXPECT_EQ(copy.src_offset, 30 * kWanRowsPerRank * 256);  // heads 30..34, contiguous
  EXPECT_EQ(copy.src_pitch, kWanRowsPerRank * 256);
  EXPECT_EQ(copy.dst_offset, 3 * kWanRowsPerRank * 256);  // after ranks 0..2's rows of a head
  EXPECT_EQ(copy.dst_pitch, kWanTokens * 256);            // the next head of rank 6
  // The source rows abut, the destination's do not: a 2D copy, 5 rows of 2.4 MB.
  const auto merged = fast_ulysses::coalesced(copy);
  EXPECT_EQ(merged.height, 5);
  EXPECT_EQ(merged.width, kWanRowsPerRank * 256);
}

TEST(Wan720pStrides, BhsdModeOne) {
  const Plan plan =
      fast_ulysses::make_plan(request_for(wan_720p(Mode::kHeadToSeq, Layout::kBHSD), 3));
  const auto& copy = plan.copies[6];  // rank 6's rows of my heads 15..19
  EXPECT_EQ(copy.width, kWanRowsPerRank * 256);
  EXPECT_EQ(copy.height, 5);
  EXPECT_EQ(copy.src_offset, 6 * kWanRowsPerRank * 256);
  EXPECT_EQ(copy.src_pitch, kWanTokens * 256);
  EXPECT_EQ(copy.dst_offset, 15 * kWanRowsPerRank * 256);
  EXPECT_EQ(copy.dst_pitch, kWanRowsPerRank * 256);
  // Heads 15..19 of rank 6's window abut: one flat copy there.
  EXPECT_EQ(fast_ulysses::coalesced(copy).height, 5);  // the source side still strides
}

// The softmax LSE of ring attention, (B, S, H, 1) fp32: 4-byte rows, any layout.
TEST(Shapes, LseRowsOfFourBytes) {
  const auto request = fast_ulysses::request_from_shape(
      2, 0, Mode::kSeqToHead, Layout::kBSHD, {2, 3, 4, 1}, 4, std::nullopt, std::nullopt);
  const Plan plan = fast_ulysses::make_plan(request);
  EXPECT_EQ(plan.output_shape, (Shape{2, 6, 2, 1}));
  const auto& copy = plan.copies[1];  // heads 2..3 of my 3 rows, for rank 1
  EXPECT_EQ(copy.width, 8);
  EXPECT_EQ(copy.height, 3);
  EXPECT_EQ(copy.depth, 2);
  EXPECT_EQ(copy.src_offset, 8);
  EXPECT_EQ(copy.src_pitch, 16);
  EXPECT_EQ(copy.dst_offset, 0);
  EXPECT_EQ(copy.dst_pitch, 8);
  EXPECT_EQ(copy.dst_slice_pitch, 6 * 8);
}

TEST_P(Wan720p, RequestFromShapeNeedsNoSplits) {
  const auto [mode, layout] = GetParam();
  const Case c = wan_720p(mode, layout);
  for (int r = 0; r < 8; ++r) {
    const Plan plan = fast_ulysses::make_plan(request_for(c, r));
    const std::vector<int64_t> shape(plan.input_shape.begin(), plan.input_shape.end());
    const auto request =
        fast_ulysses::request_from_shape(8, r, mode, layout, shape, 2, std::nullopt, std::nullopt);
    EXPECT_EQ(request.seq_splits, c.seq_splits);
    EXPECT_EQ(request.head_splits, c.head_splits);
    EXPECT_EQ(request.batch, 1);
    EXPECT_EQ(request.head_dim, kWanDim);
  }
}

INSTANTIATE_TEST_SUITE_P(BothModesEveryLayout, Wan720p,
                         ::testing::Combine(::testing::Values(Mode::kSeqToHead, Mode::kHeadToSeq),
                                            ::testing::Values(Layout::kBSHD, Layout::kSBHD,
                                                              Layout::kBHSD)),
                         [](const auto& info) {
                           return "mode" +
                                  std::to_string(static_cast<int>(std::get<0>(info.param))) + "_" +
                                  fast_ulysses::layout_name(std::get<1>(info.param));
                         });

TEST(Shapes, Wan13BTwelveHeadsOnEightRanks) {
  // 12 heads do not divide 8: head_splits [2,2,2,2,1,1,1,1]. Rank 5 keeps 1 head.
  const std::vector<int64_t> heads{2, 2, 2, 2, 1, 1, 1, 1};
  const auto request = fast_ulysses::request_from_shape(8, 5, Mode::kSeqToHead, Layout::kBSHD,
                                                        {1, 4096, 12, 128}, 2, std::nullopt, heads);
  const Plan plan = fast_ulysses::make_plan(request);
  EXPECT_EQ(plan.output_shape, (Shape{1, 8 * 4096, 1, 128}));
  EXPECT_EQ(plan.window_bytes, 8 * 4096 * 2 * 256);  // ranks 0..3 receive 2 heads
  EXPECT_EQ(plan.copies[0].bytes(), 4096 * 2 * 256);
  EXPECT_EQ(plan.copies[7].bytes(), 4096 * 1 * 256);
}

TEST(Shapes, RequestFromShapeMatchesExplicitRequest) {
  std::mt19937_64 rng(77);
  for (int k = 0; k < 2000; ++k) {
    const Case c = random_case(rng);
    for (int r = 0; r < c.world_size(); ++r) {
      const Plan plan = fast_ulysses::make_plan(request_for(c, r));
      const std::vector<int64_t> shape(plan.input_shape.begin(), plan.input_shape.end());
      const auto request = fast_ulysses::request_from_shape(
          c.world_size(), r, c.mode, c.layout, shape, c.element_size, c.seq_splits, c.head_splits);
      const Case back{request.mode,       request.layout,       request.batch,
                      request.head_dim,   request.element_size, request.seq_splits,
                      request.head_splits};
      ASSERT_EQ(describe(back), describe(c)) << "rank " << r;
      ASSERT_EQ(request.rank, r);
    }
  }
}

TEST(Shapes, ParseLayoutAndMode) {
  EXPECT_EQ(fast_ulysses::parse_layout("bshd"), Layout::kBSHD);
  EXPECT_EQ(fast_ulysses::parse_layout("sbhd"), Layout::kSBHD);
  EXPECT_EQ(fast_ulysses::parse_layout("bhsd"), Layout::kBHSD);
  EXPECT_STREQ(fast_ulysses::layout_name(Layout::kBHSD), "bhsd");
  for (Layout layout : fast_ulysses::kLayouts)  // every name parses back to its layout
    EXPECT_EQ(fast_ulysses::parse_layout(fast_ulysses::layout_name(layout)), layout);
  EXPECT_STREQ(fast_ulysses::layout_name(Layout::kSBHD), "sbhd");
  EXPECT_STREQ(fast_ulysses::layout_name(Layout::kBSHD), "bshd");
  EXPECT_EQ(fast_ulysses::parse_mode(0), Mode::kSeqToHead);
  EXPECT_EQ(fast_ulysses::parse_mode(1), Mode::kHeadToSeq);
}

}  // namespace
}  // namespace fu_test
