// The host-side copy plan of one Ulysses all-to-all: pure C++17, no CUDA, no torch.
//
// Contract. For world size P, this rank r, a mode, a layout and the split vectors, make_plan()
// returns r's input and output shapes, the window bytes every rank must reserve for this call
// (the maximum output size over ranks, so the symmetric allocation is the same everywhere), and
// one CopyDescriptor per peer in rank order (self included). Executing descriptor j copies the
// chunk r owes rank j from r's input into rank j's receive window; once every rank has executed
// its plan, each window holds that rank's output, contiguous, starting at byte 0.
//
// Every limit of the product is checked here, once; violations throw PlanError whose message
// names the argument, the value and the rule.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace fast_ulysses {

// The product's limits, defined here once; the transport and Python read them from here
// (Python through `_C.LIMITS`, csrc/ops/module_c.cpp).
constexpr int kMaxWorldSize = 8;                 // ranks of one group: one node
constexpr int64_t kMaxBytes = int64_t{1} << 50;  // bytes of one tensor; bound of every split
// Rows of any byte width are accepted. Rows whose bytes (d * element_size), offsets and pitches
// are multiples of this go through the pitched copy-engine calls; others are copied by an SM
// kernel (csrc/transport/copy_engine.cpp says why). A speed note, never a refusal.
constexpr int64_t kCopyEngineAlignment = 16;

enum class Layout { kBSHD = 0, kSBHD = 1, kBHSD = 2 };
// kSeqToHead is mode 0: (b, seq_splits[r], N, d) -> (b, S, head_splits[r], d).
// kHeadToSeq is mode 1, its exact inverse. sbhd swaps the first two dimensions of both; bhsd
// holds (b, heads, seq, d) on both sides: (b, N, seq_splits[r], d) -> (b, head_splits[r], S, d).
enum class Mode { kSeqToHead = 0, kHeadToSeq = 1 };
// Every layout, in enum order: what parse_layout accepts and the `layouts` op lists.
constexpr std::array<Layout, 3> kLayouts = {Layout::kBSHD, Layout::kSBHD, Layout::kBHSD};

class PlanError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

Layout parse_layout(const std::string& name);  // "bshd" | "sbhd" | "bhsd", else PlanError.
const char* layout_name(Layout layout);
Mode parse_mode(int64_t mode);  // 0 | 1, else PlanError.

// One 3D pitched copy, all in bytes: for z < depth, y < height, copy `width` bytes from
// src + src_offset + z * src_slice_pitch + y * src_pitch
// to dst + dst_offset + z * dst_slice_pitch + y * dst_pitch.
// `dst` is the receiving peer's window. A descriptor with width, height or depth 0 moves nothing.
struct CopyDescriptor {
  int peer = 0;
  int64_t src_offset = 0;
  int64_t dst_offset = 0;
  int64_t width = 0;
  int64_t height = 0;
  int64_t depth = 0;
  int64_t src_pitch = 0;
  int64_t dst_pitch = 0;
  int64_t src_slice_pitch = 0;
  int64_t dst_slice_pitch = 0;

  int64_t bytes() const { return width * height * depth; }
  // One past the last byte touched on each side (0 for an empty copy).
  int64_t src_extent() const;
  int64_t dst_extent() const;
};

// The same copy with dense dimensions merged: slices that abut become more rows, rows that abut
// on both sides become one wider row, so a transport can issue a 1D or 2D copy where the data
// allows it (on an H200 a 1D device copy ran ~3x faster than a pitched one; docs/BENCHMARK.md).
// Executing the result moves exactly the same bytes to the same places.
CopyDescriptor coalesced(CopyDescriptor copy);

struct PlanRequest {
  int world_size = 1;
  int rank = 0;
  Mode mode = Mode::kSeqToHead;
  Layout layout = Layout::kBSHD;
  int64_t batch = 1;                 // b
  int64_t head_dim = 1;              // d
  int64_t element_size = 2;          // bytes per element: 1, 2 or 4
  std::vector<int64_t> seq_splits;   // length P: sequence rows each rank holds before mode 0
  std::vector<int64_t> head_splits;  // length P: heads each rank holds after mode 0
};

struct Plan {
  PlanRequest request;
  std::array<int64_t, 4> input_shape{};  // in the request's layout
  std::array<int64_t, 4> output_shape{};
  int64_t input_bytes = 0;
  int64_t output_bytes = 0;
  int64_t window_bytes = 0;            // max over ranks of output bytes: what every rank reserves
  uint64_t request_hash = 0;           // call_signature.h's hash of the request (rank-independent)
  std::vector<CopyDescriptor> copies;  // copies[j].peer == j, j = 0..P-1
  // An owned result: this rank's own chunk goes from the input straight into the result
  // (copies[rank] with the result as its destination), and these copies bring everything else
  // from the window into the result: the peers' chunks before and after mine along the gathered
  // dimension, at most two copies, empty ones left out. Source and destination have the same
  // geometry (the result is laid out like the window); `peer` is this rank.
  std::vector<CopyDescriptor> collect;
};

// Throws PlanError unless 1 <= world_size <= kMaxWorldSize and 0 <= rank < world_size: the one
// check of a group's size and rank, in int64 so that no caller narrows a bad value first.
void check_world_size_and_rank(int64_t world_size, int64_t rank);

// Throws PlanError on any violated limit. Zero entries in seq_splits or head_splits are allowed
// (a rank may hold no rows or no heads; its copies are empty), but S and N must be positive.
void validate(const PlanRequest& request);
Plan make_plan(const PlanRequest& request);

// Builds a request from this rank's input shape (in `layout`) and optional splits. Missing splits
// are even: mode 0 takes seq_splits = [s_local] * P and head_splits = N / P (N must divide);
// mode 1 takes head_splits = [h_local] * P and seq_splits = S / P (S must divide). Given splits
// must agree with the shape. This is the one entry point the Python API and the ops use.
PlanRequest request_from_shape(int world_size, int rank, Mode mode, Layout layout,
                               const std::vector<int64_t>& input_shape, int64_t element_size,
                               const std::optional<std::vector<int64_t>>& seq_splits,
                               const std::optional<std::vector<int64_t>>& head_splits);

}  // namespace fast_ulysses
