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
//
// What ranks agree on, and what they do not. A PlanRequest holds only what every rank of a call
// must agree on (world size, mode, layout, batch, head dim, element size, the splits) plus this
// rank's index; call_signature.h's request_hash hashes exactly its rank-independent fields. The
// input's strides are this rank's own business (one rank may pass a packed view, another a
// contiguous tensor, for the same call), so they are not part of the request nor of its hash:
// make_plan takes them as a separate argument, and they change only the source side of this
// rank's copies (offsets and pitches into its input), never where bytes land.
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

// A 4-d tensor's extents and element strides, in its layout's order (torch's sizes() and
// strides() of the input: b, s, h, d for bshd).
using Shape4 = std::array<int64_t, 4>;
using Strides = std::array<int64_t, 4>;

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
  Shape4 input_shape{};  // in the request's layout
  Shape4 output_shape{};
  // The element strides the copies read the input with: contiguous unless make_plan was given
  // others; a dimension of extent 1 (or every one, for an empty input) carries its contiguous
  // stride, which no copy depends on.
  Strides input_strides{};
  int64_t input_bytes = 0;       // the input's elements, in bytes
  int64_t input_span_bytes = 0;  // from its first element to one past its last: what copies read
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

// The strides of a dense row-major tensor of `shape`: products of the inner extents (torch counts
// an extent of 0 as 1 there; no copy of an empty input depends on it).
Strides contiguous_strides(const Shape4& shape);

// The source rule. A copy reads rows of its input: a run of whole heads of one token (bshd, sbhd)
// or a run of whole sequence rows of one head (bhsd), every row one stride after the last, every
// slice (a batch element; none in sbhd, which folds the batch into the rows) likewise. So an input
// of `shape` is read as it stands exactly when its element strides are "regular": none negative,
// its span at most 2^50 bytes, and, ignoring the stride of any dimension of extent 1,
//   - head_dim: stride 1;
//   - bshd, sbhd: the heads abut (stride head_dim); the tokens' rows do not overlap (row stride
//     >= heads * head_dim; in sbhd with b > 1 the rows are (token, batch) pairs, so the sequence
//     stride is b times the batch stride there); bshd batch stride >= seq * sequence stride;
//   - bhsd: a head's sequence rows abut (stride head_dim); head stride >= seq * head_dim;
//     batch stride >= heads * head stride.
// Packed projections are regular: q of qkv.view(b, s, 3, N, d)[:, :, 0] or qkv.narrow(2, 0, N)
// (bshd, sbhd), and of a (b, 3N, s, d) qkv narrowed along the heads (bhsd). Anything else
// (a transpose, an expand's stride 0 over several rows, whose overlapping rows the copy engines'
// pitched copies refuse) is "irregular": the ops copy it once with .contiguous() first.
// Returns why the strides are irregular, "" when they are regular. Any shape and strides may be
// passed (a shape past the limits is irregular); nothing overflows.
std::string irregular_strides_reason(Layout layout, const Shape4& shape, const Strides& strides,
                                     int64_t element_size);
bool regular_input_strides(Layout layout, const Shape4& shape, const Strides& strides,
                           int64_t element_size);

// The plan of `request`. `input_strides` (elements, layout order) are this rank's input's: the
// copies read it through them; none means contiguous. Throws PlanError for a request breaking a
// limit and for irregular strides (irregular_strides_reason's words). With contiguous strides
// the copies are exactly those of a contiguous input.
Plan make_plan(const PlanRequest& request, const std::optional<Strides>& input_strides = {});

// Builds a request from this rank's input shape (in `layout`) and optional splits. Missing splits
// are even: mode 0 takes seq_splits = [s_local] * P and head_splits = N / P (N must divide);
// mode 1 takes head_splits = [h_local] * P and seq_splits = S / P (S must divide). Given splits
// must agree with the shape. This is the one entry point the Python API and the ops use.
PlanRequest request_from_shape(int world_size, int rank, Mode mode, Layout layout,
                               const std::vector<int64_t>& input_shape, int64_t element_size,
                               const std::optional<std::vector<int64_t>>& seq_splits,
                               const std::optional<std::vector<int64_t>>& head_splits);

}  // namespace fast_ulysses
