// The yardstick of the plan tests, and the harness that runs real plans on host buffers.
//
// reference_all_to_all() is written from the definition in docs/API.md alone, with index
// arithmetic: it never calls make_plan() nor looks at a CopyDescriptor, so a wrong stride in the
// plan cannot be mirrored here. Mode 0: out_j[bb, row_off(i) + s, h, :] = in_i[bb, s, head_off(j) +
// h, :]; mode 1 is the exact inverse. bshd, sbhd and bhsd.
//
// execute_plans() is the other side: every rank's make_plan() executed with execute_on_host()
// into P windows of window_bytes, poisoned with a sentinel beforehand.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace fu_test {

using Bytes = std::vector<std::byte>;
using RankBuffers = std::vector<Bytes>;  // one buffer per rank, in rank order

// One all-to-all call as every rank sees it. P is the length of the split vectors.
struct Case {
  fast_ulysses::Mode mode = fast_ulysses::Mode::kSeqToHead;
  fast_ulysses::Layout layout = fast_ulysses::Layout::kBSHD;
  int64_t batch = 1;
  int64_t head_dim = 8;
  int64_t element_size = 2;
  std::vector<int64_t> seq_splits;
  std::vector<int64_t> head_splits;

  int world_size() const { return static_cast<int>(seq_splits.size()); }
};

std::string describe(const Case& c);  // one line, for failure messages

// --- The reference (no plan involved). ---
int64_t reference_input_bytes(const Case& c, int rank);
int64_t reference_output_bytes(const Case& c, int rank);
// inputs[r] must hold reference_input_bytes(c, r) bytes; returns every rank's output.
RankBuffers reference_all_to_all(const Case& c, const RankBuffers& inputs);

// Where byte `out_byte` of rank `receiver`'s output comes from, by the same index arithmetic,
// without buffers: what the arithmetic checks of huge cases sample.
struct SourceByte {
  int rank = 0;
  int64_t byte = 0;
};
SourceByte reference_source_of(const Case& c, int receiver, int64_t out_byte);

// --- The plan under test. ---
fast_ulysses::PlanRequest request_for(const Case& c, int rank);
std::vector<fast_ulysses::Plan> make_plans(const Case& c);  // plans[r] is rank r's

struct Executed {
  RankBuffers windows;  // window_bytes each, after every rank ran its copies
  RankBuffers outputs;  // first output_bytes of each window
};
// Rank by rank, peer by peer: plans[r].copies[j] copies inputs[r] into windows[j].
Executed execute_plans(const std::vector<fast_ulysses::Plan>& plans, const RankBuffers& inputs,
                       std::byte sentinel);

// Rank r's output for `c`: make_plans + execute_plans, windows poisoned with 0.
RankBuffers run_plans(const Case& c, const RankBuffers& inputs);

}  // namespace fu_test
