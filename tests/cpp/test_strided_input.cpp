// Inputs given as strided views: make_plan(request, strides) reads a regular view (a packed
// projection's q, k or v, a window of a longer sequence, every other batch element) as it stands,
// giving exactly the windows and owned results of the contiguous input; contiguous strides give
// exactly the descriptors the plan always gave a dense input; irregular strides are refused by
// name (the ops copy such an input once with .contiguous()); and the strides stay out of the
// request and its cross-rank hash.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "cases.h"
#include "checks.h"
#include "printers.h"
#include "reference.h"
#include "strided.h"

namespace fu_test {
namespace {

using fast_ulysses::CopyDescriptor;
using fast_ulysses::Layout;
using fast_ulysses::Mode;
using fast_ulysses::Plan;
using fast_ulysses::PlanError;
using fast_ulysses::PlanRequest;
using fast_ulysses::Shape4;
using fast_ulysses::Strides;

int64_t total(const std::vector<int64_t>& v) {
  int64_t sum = 0;
  for (int64_t x : v) sum += x;
  return sum;
}

int64_t before(const std::vector<int64_t>& v, int j) {
  int64_t sum = 0;
  for (int i = 0; i < j; ++i) sum += v[i];
  return sum;
}

// The copies of a dense input as the plan computed them before it took strides, frozen here:
// the contiguous plan must keep giving exactly these.
std::vector<CopyDescriptor> dense_copies(const PlanRequest& q) {
  const int r = q.rank;
  const auto& seq = q.seq_splits;
  const auto& heads = q.head_splits;
  const int64_t S = total(seq), N = total(heads), row = q.head_dim * q.element_size;
  const bool sbhd = q.layout == Layout::kSBHD, bhsd = q.layout == Layout::kBHSD;
  const bool to_heads = q.mode == Mode::kSeqToHead;
  const int64_t fold = sbhd ? q.batch : 1;
  std::vector<CopyDescriptor> copies;
  for (int j = 0; j < q.world_size; ++j) {
    CopyDescriptor c;
    c.peer = j;
    c.depth = sbhd ? 1 : q.batch;
    if (bhsd && to_heads) {
      c = {j,
           before(heads, j) * seq[r] * row,
           before(seq, r) * row,
           seq[r] * row,
           heads[j],
           c.depth,
           seq[r] * row,
           S * row,
           N * seq[r] * row,
           heads[j] * S * row};
    } else if (bhsd) {
      c = {j,
           before(seq, j) * row,
           before(heads, r) * seq[j] * row,
           seq[j] * row,
           heads[r],
           c.depth,
           S * row,
           seq[j] * row,
           heads[r] * S * row,
           N * seq[j] * row};
    } else if (to_heads) {
      c = {j,
           before(heads, j) * row,
           before(seq, r) * fold * heads[j] * row,
           heads[j] * row,
           seq[r] * fold,
           c.depth,
           N * row,
           heads[j] * row,
           seq[r] * fold * N * row,
           S * fold * heads[j] * row};
    } else {
      c = {j,
           before(seq, j) * fold * heads[r] * row,
           before(heads, r) * row,
           heads[r] * row,
           seq[j] * fold,
           c.depth,
           heads[r] * row,
           N * row,
           S * fold * heads[r] * row,
           seq[j] * fold * N * row};
    }
    copies.push_back(c);
  }
  return copies;
}

::testing::AssertionResult same_copies(const std::vector<CopyDescriptor>& got,
                                       const std::vector<CopyDescriptor>& want) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " copies";
  for (size_t j = 0; j < got.size(); ++j) {
    const CopyDescriptor &a = got[j], &b = want[j];
    const auto fields = [](const CopyDescriptor& c) {
      return std::make_tuple(c.peer, c.src_offset, c.dst_offset, c.width, c.height, c.depth,
                             c.src_pitch, c.dst_pitch, c.src_slice_pitch, c.dst_slice_pitch);
    };
    if (fields(a) != fields(b))
      return ::testing::AssertionFailure()
             << "copy " << j << ": src_offset " << a.src_offset << " vs " << b.src_offset
             << ", pitches " << a.src_pitch << "/" << a.src_slice_pitch << " vs " << b.src_pitch
             << "/" << b.src_slice_pitch << " (dst " << a.dst_offset << "/" << a.dst_pitch << "/"
             << a.dst_slice_pitch << " vs " << b.dst_offset << "/" << b.dst_pitch << "/"
             << b.dst_slice_pitch << ")";
  }
  return ::testing::AssertionSuccess();
}

// A dense input's strides with junk in every extent-1 dimension (torch calls such a tensor
// contiguous, and gives any stride there).
Strides junk_in_extent_one(const Shape4& shape, int64_t junk) {
  Strides strides = fast_ulysses::contiguous_strides(shape);
  for (size_t k = 0; k < 4; ++k)
    if (shape[k] == 1) strides[k] = junk;
  return strides;
}

class Dense : public ::testing::TestWithParam<std::tuple<Mode, Layout>> {};

TEST_P(Dense, ContiguousStridesGiveTheDenseDescriptors) {
  const auto [mode, layout] = GetParam();
  for (int P = 1; P <= fast_ulysses::kMaxWorldSize; ++P)
    for (const Case& c : exhaustive_cases(P, mode, layout))
      for (int r = 0; r < P; ++r) {
        const PlanRequest request = request_for(c, r);
        const Plan plain = fast_ulysses::make_plan(request);
        const auto want = dense_copies(request);
        ASSERT_TRUE(same_copies(plain.copies, want)) << describe(c) << " rank " << r;
        ASSERT_EQ(plain.input_strides, fast_ulysses::contiguous_strides(plain.input_shape));
        ASSERT_EQ(plain.input_span_bytes, plain.input_bytes) << describe(c);
        for (int64_t junk : {int64_t{0}, int64_t{-5}, int64_t{1} << 40}) {
          const Plan given =
              fast_ulysses::make_plan(request, junk_in_extent_one(plain.input_shape, junk));
          ASSERT_TRUE(same_copies(given.copies, want)) << describe(c) << " junk " << junk;
          ASSERT_EQ(given.input_strides, plain.input_strides) << describe(c);
        }
      }
}

INSTANTIATE_TEST_SUITE_P(AllModesAndLayouts, Dense,
                         ::testing::Combine(::testing::Values(Mode::kSeqToHead, Mode::kHeadToSeq),
                                            ::testing::Values(Layout::kBSHD, Layout::kSBHD,
                                                              Layout::kBHSD)));

// --- Packed views, every layout and mode, over the exhaustive grid at P = 1, 2, 3, 5 and 8. ---

class Packed : public ::testing::TestWithParam<std::tuple<Mode, Layout, Packing>> {};

TEST_P(Packed, MatchTheContiguousInput) {
  const auto [mode, layout, packing] = GetParam();
  int regular = 0, irregular = 0;
  uint64_t seed = 1;
  for (int P : {1, 2, 3, 5, 8})
    for (const Case& c : exhaustive_cases(P, mode, layout)) {
      auto views = packed_views(c, packing, seed % 2 == 0);
      for (int r = 0; r < P; ++r) {
        if (!views[r]) continue;
        const bool want = expected_regular(layout, views[r]->shape, packing);
        const std::string why = fast_ulysses::irregular_strides_reason(
            layout, views[r]->shape, views[r]->strides, c.element_size);
        ASSERT_EQ(why.empty(), want) << describe(c) << " rank " << r << ": " << why;
        if (want) {
          ++regular;
          continue;
        }
        ++irregular;
        ASSERT_THROW(fast_ulysses::make_plan(request_for(c, r), views[r]->strides), PlanError);
        views[r].reset();  // the ops copy it once: a dense input
      }
      ASSERT_TRUE(strided_matches_reference(c, views, seed++))
          << describe(c) << " " << packing_name(packing);
    }
  EXPECT_GT(regular, 0);
  // Every packing but these is regular in every case.
  const bool sometimes_irregular = packing == Packing::kTransposed ||
                                   packing == Packing::kHeadDimPad ||
                                   packing == Packing::kExpandBatch ||
                                   (packing == Packing::kBatchNarrow && layout == Layout::kSBHD);
  EXPECT_EQ(irregular > 0, sometimes_irregular);
}

INSTANTIATE_TEST_SUITE_P(AllPackings, Packed,
                         ::testing::Combine(::testing::Values(Mode::kSeqToHead, Mode::kHeadToSeq),
                                            ::testing::Values(Layout::kBSHD, Layout::kSBHD,
                                                              Layout::kBHSD),
                                            ::testing::ValuesIn(kPackings)),
                         [](const auto& info) {
                           return "mode" +
                                  std::to_string(static_cast<int>(std::get<0>(info.param))) + "_" +
                                  fast_ulysses::layout_name(std::get<1>(info.param)) + "_" +
                                  packing_name(std::get<2>(info.param));
                         });

// --- The rule's words, and its edges. ---

std::string reason(Layout layout, Shape4 shape, Strides strides, int64_t es = 2) {
  return fast_ulysses::irregular_strides_reason(layout, shape, strides, es);
}

TEST(StridedRule, NamesWhatIsIrregular) {
  // bshd (2, 4, 3, 8) seen through a transpose of its (2, 3, 4, 8) bhsd storage.
  EXPECT_EQ(reason(Layout::kBSHD, {2, 4, 3, 8}, {96, 8, 32, 1}),
            "strides [96, 8, 32, 1] of shape [2, 4, 3, 8] (bshd): heads stride=32: a token's "
            "heads must abut (stride head_dim=8)");
  EXPECT_EQ(reason(Layout::kBSHD, {2, 4, 3, 8}, {192, 48, 16, 2}),
            "strides [192, 48, 16, 2] of shape [2, 4, 3, 8] (bshd): stride[3]=2: a head's "
            "elements must be adjacent (stride 1)");
  EXPECT_EQ(reason(Layout::kBSHD, {2, 4, 3, 8}, {0, 24, 8, 1}),
            "strides [0, 24, 8, 1] of shape [2, 4, 3, 8] (bshd): batch stride=0: batch "
            "elements must not overlap (stride >= 96)");
  EXPECT_EQ(reason(Layout::kBSHD, {2, 4, 3, 8}, {96, 0, 8, 1}),
            "strides [96, 0, 8, 1] of shape [2, 4, 3, 8] (bshd): seq stride=0: rows of 3 heads "
            "x head_dim 8 must not overlap (stride >= 24)");
  EXPECT_EQ(reason(Layout::kSBHD, {4, 2, 3, 8}, {72, 24, 8, 1}),
            "strides [72, 24, 8, 1] of shape [4, 2, 3, 8] (sbhd): seq stride=72 with batch "
            "stride=24: sbhd rows are (token, batch) pairs, so the seq stride must be batch=2 "
            "times the batch stride");
  EXPECT_EQ(reason(Layout::kBHSD, {2, 3, 4, 8}, {96, 8, 24, 1}),
            "strides [96, 8, 24, 1] of shape [2, 3, 4, 8] (bhsd): seq stride=24: a head's "
            "sequence rows must abut (stride head_dim=8)");
  EXPECT_EQ(reason(Layout::kBHSD, {2, 3, 4, 8}, {96, 16, 8, 1}),
            "strides [96, 16, 8, 1] of shape [2, 3, 4, 8] (bhsd): heads stride=16: a head's 4 "
            "rows must not overlap the next head's (stride >= seq * head_dim=32)");
  EXPECT_EQ(reason(Layout::kBSHD, {2, 4, 3, 8}, {-96, 24, 8, 1}),
            "strides [-96, 24, 8, 1] of shape [2, 4, 3, 8] (bshd): strides must be >= 0");
  const int64_t big = int64_t{1} << 48;
  EXPECT_EQ(reason(Layout::kBSHD, {3, 4, 3, 8}, {big, 24, 8, 1}),
            "strides [" + std::to_string(big) +
                ", 24, 8, 1] of shape [3, 4, 3, 8] (bshd): its elements span more than 2^50 bytes");
}

TEST(StridedRule, MakePlanRefusesIrregularStridesInTheRulesWords) {
  Case c{Mode::kSeqToHead, Layout::kBSHD, 2, 8, 2, {4, 4}, {3, 3}};
  try {
    fast_ulysses::make_plan(request_for(c, 0), Strides{96, 8, 32, 1});
    FAIL() << "irregular strides accepted";
  } catch (const PlanError& error) {
    EXPECT_EQ(std::string(error.what()),
              "input strides [96, 8, 32, 1] of shape [2, 4, 6, 8] (bshd): heads stride=32: a "
              "token's heads must abut (stride head_dim=8)");
  }
}

TEST(StridedRule, ExtentOneDimensionsTakeAnyStride) {
  // (1, 1, 3, 8) bshd: only the heads and head_dim strides matter.
  for (int64_t junk : {std::numeric_limits<int64_t>::min(), int64_t{-1}, int64_t{0},
                       std::numeric_limits<int64_t>::max()})
    EXPECT_EQ(reason(Layout::kBSHD, {1, 1, 3, 8}, {junk, junk, 8, 1}), "") << junk;
  // An expand over one batch element, or over none, moves as it stands.
  EXPECT_EQ(reason(Layout::kBSHD, {1, 4, 3, 8}, {0, 24, 8, 1}), "");
  EXPECT_EQ(reason(Layout::kBSHD, {2, 0, 3, 8}, {0, 0, 0, 0}), "");
  // head_dim 1: its stride is free, the heads then abut at stride 1.
  EXPECT_EQ(reason(Layout::kBSHD, {2, 4, 3, 1}, {36, 9, 1, 7}), "");
}

TEST(StridedRule, ShapesPastTheLimitsAreIrregularNotUndefined) {
  const int64_t huge = std::numeric_limits<int64_t>::max();
  EXPECT_NE(reason(Layout::kBSHD, {huge, huge, huge, huge}, {1, 1, 1, 1}), "");
  EXPECT_NE(reason(Layout::kBHSD, {-1, 2, 3, 4}, {24, 12, 4, 1}), "");
  EXPECT_NE(reason(Layout::kSBHD, {2, 2, 2, 2}, {huge, 4, 2, 1}), "");
  EXPECT_NE(reason(Layout::kSBHD, {2, 2, 2, 2}, {8, 4, 2, 1}, 0), "");
}

TEST(StridedRule, StridesStayOutOfTheRequestAndItsHash) {
  Case c{Mode::kHeadToSeq, Layout::kBHSD, 2, 8, 2, {3, 5}, {2, 2}};
  const Plan dense = fast_ulysses::make_plan(request_for(c, 1));
  const StridedView view = packed_view(c.layout, dense.input_shape, Packing::kQkvHeads, 1);
  const Plan packed = fast_ulysses::make_plan(request_for(c, 1), view.strides);
  EXPECT_EQ(packed.request_hash, dense.request_hash);
  EXPECT_EQ(packed.window_bytes, dense.window_bytes);
  EXPECT_EQ(packed.input_strides, view.strides);
  EXPECT_GT(packed.input_span_bytes, packed.input_bytes);
  for (size_t j = 0; j < dense.copies.size(); ++j) {  // the destination side is unchanged
    EXPECT_EQ(packed.copies[j].dst_offset, dense.copies[j].dst_offset);
    EXPECT_EQ(packed.copies[j].dst_pitch, dense.copies[j].dst_pitch);
    EXPECT_EQ(packed.copies[j].dst_slice_pitch, dense.copies[j].dst_slice_pitch);
  }
}

// Random strides around the dense ones: whatever the rule accepts moves the right bytes (the
// rule is never too loose); the packings above show it is not too strict for real views.
TEST(StridedRule, RandomStridesTheRuleAcceptsMoveTheRightBytes) {
  std::mt19937_64 rng(20261204);
  int accepted = 0;
  for (int i = 0; i < 3000; ++i) {
    const Case c = random_case(rng);
    std::vector<std::optional<StridedView>> views(c.world_size());
    for (int r = 0; r < c.world_size(); ++r) {
      const Shape4 shape = fast_ulysses::make_plan(request_for(c, r)).input_shape;
      const Strides dense = fast_ulysses::contiguous_strides(shape);
      StridedView view{shape};
      int64_t last = 0;
      for (size_t k = 0; k < 4; ++k) {
        const int64_t pick[] = {0, 1, dense[k], dense[k] * 2, dense[k] + 1, c.head_dim};
        view.strides[k] = rng() % 2 ? dense[k] : pick[rng() % 6];
        last += std::max<int64_t>(shape[k] - 1, 0) * view.strides[k];
      }
      view.offset = static_cast<int64_t>(rng() % 3);
      view.parent_elements = view.offset + last + 1;
      if (fast_ulysses::regular_input_strides(c.layout, shape, view.strides, c.element_size)) {
        views[r] = view;
        ++accepted;
      } else {
        EXPECT_THROW(fast_ulysses::make_plan(request_for(c, r), view.strides), PlanError);
      }
    }
    ASSERT_TRUE(strided_matches_reference(c, views, i)) << describe(c);
  }
  EXPECT_GT(accepted, 1000);
}

}  // namespace
}  // namespace fu_test
