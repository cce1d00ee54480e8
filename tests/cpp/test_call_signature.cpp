// The handshake's call signature (csrc/plan/call_signature.h): the same on every rank of one
// call, different when the ranks disagree on anything that decides where bytes go, never 0 or 1.
#include <gtest/gtest.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "plan/call_signature.h"
#include "plan/plan.h"

namespace fu_test {
namespace {

using fast_ulysses::call_signature;
using fast_ulysses::Layout;
using fast_ulysses::Mode;
using fast_ulysses::PlanRequest;
using fast_ulysses::request_hash;
using fast_ulysses::tag_hash;

PlanRequest wan_like(int rank) {
  PlanRequest request;
  request.world_size = 4;
  request.rank = rank;
  request.mode = Mode::kSeqToHead;
  request.layout = Layout::kBSHD;
  request.batch = 1;
  request.head_dim = 128;
  request.element_size = 2;
  request.seq_splits = {10, 10, 10, 9};
  request.head_splits = {3, 3, 3, 3};
  return request;
}

uint32_t signature(const PlanRequest& request, const std::string& tag = "q") {
  return call_signature(request_hash(request), tag_hash(tag));
}

TEST(CallSignature, EveryRankOfOneCallAgrees) {
  const uint32_t first = signature(wan_like(0));
  for (int rank = 1; rank < 4; ++rank) EXPECT_EQ(signature(wan_like(rank)), first) << rank;
}

TEST(CallSignature, EachDisagreementChangesIt) {
  const uint32_t base = signature(wan_like(0));
  std::vector<PlanRequest> changed(9, wan_like(0));
  changed[0].mode = Mode::kHeadToSeq;
  changed[1].layout = Layout::kSBHD;
  changed[2].batch = 2;
  changed[3].head_dim = 64;
  changed[4].element_size = 4;
  changed[5].seq_splits = {10, 10, 9, 10};   // same total, other rows per rank
  changed[6].head_splits = {4, 3, 3, 2};     // same total, other heads per rank
  changed[7].head_splits = {3, 3, 3, 3, 0};  // a different length
  changed[8].world_size = 5;
  std::set<uint32_t> seen = {base};
  for (size_t i = 0; i < changed.size(); ++i) {
    const uint32_t value = signature(changed[i]);
    EXPECT_NE(value, base) << "change " << i;
    seen.insert(value);
  }
  EXPECT_EQ(seen.size(), changed.size() + 1) << "two different calls share a signature";
  EXPECT_NE(signature(wan_like(0), "k"), base) << "the tag";
  EXPECT_NE(signature(wan_like(0), "q "), base) << "the tag's length";
}

TEST(CallSignature, NeverAHandshakeConstant) {
  for (uint64_t request : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}, uint64_t{0x80000000}})
    for (uint64_t tag : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}}) {
      const uint32_t value = call_signature(request, tag);
      EXPECT_NE(value, 0u);
      EXPECT_NE(value, 1u);
      EXPECT_NE(value & 0x80000000u, 0u);
    }
}

}  // namespace
}  // namespace fu_test
