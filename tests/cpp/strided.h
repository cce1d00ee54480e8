// Inputs given as strided views (a packed qkv projection's q, a window of a longer sequence, a
// transpose, an expand), for the tests of the plan's source strides: each rank's input is a view
// into a larger "parent" buffer, read by make_plan(request, strides)'s copies as it stands, and
// compared with the reference run on the view's elements gathered into a dense buffer (what
// .contiguous() gives), which never involves a stride.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "plan/plan.h"
#include "reference.h"

namespace fu_test {

// A view of `shape` (layout order) into a parent buffer: element (i0, i1, i2, i3) of the view is
// parent element offset + sum(i_k * strides[k]).
struct StridedView {
  fast_ulysses::Shape4 shape{};
  fast_ulysses::Strides strides{};
  int64_t offset = 0;  // elements
  int64_t parent_elements = 0;
};

// How a view is cut from its parent.
enum class Packing {
  kQkvHeads,     // q, k or v of a packed projection: the heads of a 3x wider parent, narrowed
  kSeqWindow,    // rows [1, 1 + s) of a parent 2 rows longer
  kBatchStep,    // every other batch element of a parent twice as large (parent[::2])
  kBatchNarrow,  // batch elements [1, 1 + b) of a parent one larger
  kHeadDimPad,   // head_dim d of rows of d + 1 (a padded last dimension)
  kTransposed,   // the other layout's storage seen through a transpose (bshd <-> bhsd, sbhd <->
                 // bshd)
  kExpandBatch,  // one batch element expanded (batch stride 0)
};
constexpr Packing kPackings[] = {Packing::kQkvHeads,    Packing::kSeqWindow,  Packing::kBatchStep,
                                 Packing::kBatchNarrow, Packing::kHeadDimPad, Packing::kTransposed,
                                 Packing::kExpandBatch};
const char* packing_name(Packing packing);

// The view of `shape` cut by `packing`; `which` picks q, k or v (0, 1, 2) for kQkvHeads.
StridedView packed_view(fast_ulysses::Layout layout, const fast_ulysses::Shape4& shape,
                        Packing packing, int which);

// Whether `packing` of `shape` is regular, stated per packing from the rule in plan.h (the
// test's own statement of it: the plan's is irregular_strides_reason).
bool expected_regular(fast_ulysses::Layout layout, const fast_ulysses::Shape4& shape,
                      Packing packing);

// A parent buffer for `view`: pseudo-random bytes in 1..255 (never the 0 sentinel) from `seed`.
Bytes make_parent(const StridedView& view, int64_t element_size, uint64_t seed);
// The view's elements in order, dense: what .contiguous() makes of it.
Bytes gather(const StridedView& view, int64_t element_size, const Bytes& parent);

// Every copy of a strided plan stays inside its input's span, and its coalesced form keeps rows
// and slices apart on the source side (pitch >= width, slice pitch >= rows * pitch: what the
// copy engines' pitched calls take): checked by arithmetic, for views too large to execute.
::testing::AssertionResult strided_copies_ok(const fast_ulysses::Plan& plan);

// Every rank r reads its input through views[r] (nullopt: a dense input, which ranks may mix),
// executed with the host executor into poisoned windows; must equal, window byte for window
// byte, the contiguous plans run on the gathered inputs, and the reference; strided_copies_ok
// holds, and the owned result (own chunk from the view, then collect) equals the reference too.
::testing::AssertionResult strided_matches_reference(
    const Case& c, const std::vector<std::optional<StridedView>>& views, uint64_t seed);

// One packing on every rank (or, `mixed`, on odd ranks only), `which` = rank % 3.
std::vector<std::optional<StridedView>> packed_views(const Case& c, Packing packing, bool mixed);

}  // namespace fu_test
