// Does the reference catch a wrong plan? Take a correct plan, change ONE field of ONE descriptor
// by a small amount that keeps the copy in bounds, execute, and require the comparison with the
// reference to fail. Every such perturbation is tried, for every field where it matters.
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "cases.h"
#include "checks.h"
#include "plan/host_executor.h"
#include "printers.h"
#include "reference.h"

namespace fu_test {
namespace {

using fast_ulysses::CopyDescriptor;
using fast_ulysses::Layout;
using fast_ulysses::Mode;
using fast_ulysses::Plan;

struct Field {
  const char* name;
  int64_t CopyDescriptor::* member;
  bool shrink_only;   // width/height/depth: only smaller (a larger copy may be hidden
                      // by a later rank overwriting the spill, which is a race, not a
                      // layout error the reference can see)
  bool needs_rows;    // a row pitch matters only when height > 1
  bool needs_slices;  // a slice pitch matters only when depth > 1
};

const std::vector<Field>& fields() {
  static const std::vector<Field> all = {
      {"src_offset", &CopyDescriptor::src_offset, false, false, false},
      {"dst_offset", &CopyDescriptor::dst_offset, false, false, false},
      {"src_pitch", &CopyDescriptor::src_pitch, false, true, false},
      {"dst_pitch", &CopyDescriptor::dst_pitch, false, true, false},
      {"src_slice_pitch", &CopyDescriptor::src_slice_pitch, false, false, true},
      {"dst_slice_pitch", &CopyDescriptor::dst_slice_pitch, false, false, true},
      {"width", &CopyDescriptor::width, true, false, false},
      {"height", &CopyDescriptor::height, true, false, false},
      {"depth", &CopyDescriptor::depth, true, false, false},
  };
  return all;
}

// Uneven, no zero entries, b = 2: every descriptor moves data, has several rows and (in bshd
// and bhsd) several slices. Rows are 16 bytes of 2-byte elements, or `head_dim` elements.
Case base_case(Mode mode, Layout layout, int64_t head_dim = 8) {
  return Case{mode, layout, 2, head_dim, 2, {3, 1, 2}, {2, 1, 3}};
}

std::vector<int64_t> deltas(const Field& field, const Case& c) {
  const bool counts =
      field.member == &CopyDescriptor::height || field.member == &CopyDescriptor::depth;
  if (counts) return {-1};
  const int64_t es = c.element_size, row = c.head_dim * c.element_size;
  if (field.shrink_only) return {-es, -row};
  return {-row, -es, es, row};
}

bool matters(const Field& field, const CopyDescriptor& copy) {
  if (copy.bytes() == 0) return false;
  if (field.needs_rows && copy.height < 2) return false;
  if (field.needs_slices && copy.depth < 2) return false;
  return true;
}

bool in_bounds(const CopyDescriptor& copy, const Plan& sender) {
  try {
    fast_ulysses::check_descriptor_bounds(copy, sender.input_bytes, sender.window_bytes);
    return true;
  } catch (const fast_ulysses::PlanError&) {
    return false;
  }
}

// Tries every (sender, peer, delta) for `field`; returns how many in-bounds perturbations ran.
// Each must make the executed result differ from the reference.
int perturb_everywhere(const Case& c, const Field& field) {
  const auto plans = make_plans(c);
  const RankBuffers inputs = make_inputs(c, 99);
  const RankBuffers expected = reference_all_to_all(c, inputs);
  EXPECT_TRUE(same_bytes(execute_plans(plans, inputs, std::byte{0}).outputs, expected));
  int tried = 0;
  for (int r = 0; r < c.world_size(); ++r)
    for (int j = 0; j < c.world_size(); ++j) {
      if (!matters(field, plans[r].copies[j])) continue;
      for (int64_t delta : deltas(field, c)) {
        auto wrong = plans;
        wrong[r].copies[j].*field.member += delta;
        if (!in_bounds(wrong[r].copies[j], wrong[r])) continue;
        ++tried;
        EXPECT_FALSE(same_bytes(execute_plans(wrong, inputs, std::byte{0}).outputs, expected))
            << field.name << " += " << delta << " on rank " << r << " -> peer " << j
            << " went unnoticed; " << describe(c);
      }
    }
  return tried;
}

class Perturbation : public ::testing::TestWithParam<std::tuple<Mode, Layout>> {};

TEST_P(Perturbation, ReferenceCatchesEveryInBoundsChange) {
  const auto [mode, layout] = GetParam();
  for (int64_t head_dim : {8, 3}) {  // 16-byte rows and 6-byte rows
    const Case c = base_case(mode, layout, head_dim);
    for (const Field& field : fields()) {
      const int tried = perturb_everywhere(c, field);
      // sbhd folds the batch into rows: depth is 1, so slice pitches are never read.
      const bool never_read = field.needs_slices && layout == Layout::kSBHD;
      if (never_read)
        EXPECT_EQ(tried, 0) << field.name;
      else
        EXPECT_GT(tried, 0) << field.name << ": no in-bounds perturbation found; " << describe(c);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BothModesEveryLayout, Perturbation,
                         ::testing::Combine(::testing::Values(Mode::kSeqToHead, Mode::kHeadToSeq),
                                            ::testing::Values(Layout::kBSHD, Layout::kSBHD,
                                                              Layout::kBHSD)),
                         [](const auto& info) {
                           return "mode" +
                                  std::to_string(static_cast<int>(std::get<0>(info.param))) + "_" +
                                  fast_ulysses::layout_name(std::get<1>(info.param));
                         });

// The control for the sbhd exemption above: a slice pitch there really is irrelevant.
TEST(Perturbation, SbhdSlicePitchIsNeverRead) {
  const Case c = base_case(Mode::kSeqToHead, Layout::kSBHD);
  auto plans = make_plans(c);
  for (auto& plan : plans)
    for (auto& copy : plan.copies) {
      ASSERT_EQ(copy.depth, 1);
      copy.src_slice_pitch += 16;
      copy.dst_slice_pitch += 16;
    }
  const RankBuffers inputs = make_inputs(c, 5);
  EXPECT_TRUE(same_bytes(execute_plans(plans, inputs, std::byte{0}).outputs,
                         reference_all_to_all(c, inputs)));
}

}  // namespace
}  // namespace fu_test
