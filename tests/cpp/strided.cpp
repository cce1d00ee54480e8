#include "strided.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "checks.h"
#include "plan/host_executor.h"

namespace fu_test {
namespace {

using fast_ulysses::CopyDescriptor;
using fast_ulysses::Layout;
using fast_ulysses::Plan;
using fast_ulysses::Shape4;
using fast_ulysses::Strides;
using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;

// Where batch, sequence and heads sit in a shape of `layout` (the test's own copy).
struct Dims {
  int batch, seq, heads;
};
Dims dims_of(Layout layout) {
  if (layout == Layout::kSBHD) return {1, 0, 2};
  if (layout == Layout::kBHSD) return {0, 2, 1};
  return {0, 1, 2};
}

bool empty(const Shape4& shape) {
  return std::any_of(shape.begin(), shape.end(), [](int64_t n) { return n == 0; });
}

// How a view is cut from its parent: the parent's extents (by view dimension), the order its
// storage holds the view's dimensions in (outermost first), and per dimension the view's step
// and first index; an expanded batch has stride 0.
struct Cut {
  Shape4 parent;
  std::array<int, 4> order = {0, 1, 2, 3};
  Shape4 step = {1, 1, 1, 1};
  Shape4 first = {0, 0, 0, 0};
  bool expand_batch = false;
};

Cut cut_of(Layout layout, const Shape4& shape, Packing packing, int which) {
  const Dims dims = dims_of(layout);
  Cut cut{shape};
  switch (packing) {
    case Packing::kQkvHeads:
      cut.parent[dims.heads] *= 3;
      cut.first[dims.heads] = which * shape[dims.heads];
      break;
    case Packing::kSeqWindow:
      cut.parent[dims.seq] += 2;
      cut.first[dims.seq] = 1;
      break;
    case Packing::kBatchStep:
      cut.parent[dims.batch] *= 2;
      cut.step[dims.batch] = 2;
      break;
    case Packing::kBatchNarrow:
      cut.parent[dims.batch] += 1;
      cut.first[dims.batch] = 1;
      break;
    case Packing::kHeadDimPad:
      cut.parent[3] += 1;
      break;
    case Packing::kTransposed:  // storage bhsd seen as bshd (and back), bshd seen as sbhd
      cut.order =
          layout == Layout::kSBHD ? std::array<int, 4>{1, 0, 2, 3} : std::array<int, 4>{0, 2, 1, 3};
      break;
    case Packing::kExpandBatch:
      cut.parent[dims.batch] = std::min<int64_t>(shape[dims.batch], 1);
      cut.expand_batch = true;
      break;
  }
  return cut;
}

// Element (i0, i1, i2, i3) of `view` in its parent.
int64_t element_of(const StridedView& view, const std::array<int64_t, 4>& index) {
  int64_t at = view.offset;
  for (size_t k = 0; k < 4; ++k) at += index[k] * view.strides[k];
  return at;
}

AssertionResult source_geometry_ok(const CopyDescriptor& copy, const Plan& plan) {
  if (copy.bytes() == 0) return AssertionSuccess();
  const CopyDescriptor c = fast_ulysses::coalesced(copy);
  if ((c.height > 1 && c.src_pitch < c.width) ||
      (c.depth > 1 && c.src_slice_pitch < c.height * c.src_pitch))
    return AssertionFailure() << "copy to peer " << c.peer << " reads overlapping rows: width "
                              << c.width << ", height " << c.height << ", depth " << c.depth
                              << ", src pitches " << c.src_pitch << "/" << c.src_slice_pitch;
  if (copy.src_extent() > plan.input_span_bytes)
    return AssertionFailure() << "copy to peer " << c.peer << " reads to byte " << copy.src_extent()
                              << " of a " << plan.input_span_bytes << "-byte span";
  return AssertionSuccess();
}

// Rank r's input: its view of parents[r] (offset applied), or the dense buffer itself.
struct Source {
  const std::byte* data;
  int64_t bytes;
};

Source source_of(const std::optional<StridedView>& view, const Bytes& parent, int64_t es) {
  const int64_t skip = view ? view->offset * es : 0;
  return {parent.data() + skip, static_cast<int64_t>(parent.size()) - skip};
}

// The owned result of rank r (own chunk from its source, then collect from its window).
Bytes owned_result(const Plan& plan, Source source, const Bytes& window) {
  Bytes out(plan.output_bytes, std::byte{0});
  const int r = plan.request.rank;
  fast_ulysses::execute_on_host(plan.copies[r], source.data, source.bytes, out.data(),
                                plan.output_bytes);
  for (const auto& copy : plan.collect)
    fast_ulysses::execute_on_host(copy, window.data(), plan.window_bytes, out.data(),
                                  plan.output_bytes);
  return out;
}

}  // namespace

AssertionResult strided_copies_ok(const Plan& plan) {
  for (const auto& copy : plan.copies)
    if (auto ok = source_geometry_ok(copy, plan); !ok) return ok;
  return AssertionSuccess();
}

const char* packing_name(Packing packing) {
  static const char* names[] = {"qkv_heads",   "seq_window", "batch_step",  "batch_narrow",
                                "headdim_pad", "transposed", "expand_batch"};
  return names[static_cast<int>(packing)];
}

StridedView packed_view(Layout layout, const Shape4& shape, Packing packing, int which) {
  const Cut cut = cut_of(layout, shape, packing, which);
  Strides storage{};
  int64_t run = 1;
  for (int p = 3; p >= 0; --p) {
    storage[cut.order[p]] = run;
    run *= std::max<int64_t>(cut.parent[cut.order[p]], 1);
  }
  StridedView view;
  view.shape = shape;
  view.parent_elements = 1;
  for (size_t k = 0; k < 4; ++k) {
    view.strides[k] = cut.step[k] * storage[k];
    view.offset += cut.first[k] * storage[k];
    view.parent_elements *= cut.parent[k];
  }
  if (cut.expand_batch) view.strides[dims_of(layout).batch] = 0;
  if (empty(shape)) view.offset = 0;  // (a parent with no elements)
  return view;
}

bool expected_regular(Layout layout, const Shape4& shape, Packing packing) {
  if (empty(shape)) return true;
  const Dims dims = dims_of(layout);
  const int64_t b = shape[dims.batch], s = shape[dims.seq], h = shape[dims.heads];
  switch (packing) {
    case Packing::kBatchNarrow:  // sbhd: the seq stride is no longer b batch strides
      return layout != Layout::kSBHD || b <= 1 || s <= 1;
    case Packing::kHeadDimPad:  // heads (bhsd: sequence rows) no longer abut
      return layout == Layout::kBHSD ? s <= 1 : h <= 1;
    case Packing::kTransposed:
      return layout == Layout::kSBHD ? b <= 1 || s <= 1 : h <= 1 || s <= 1;
    case Packing::kExpandBatch:
      return b <= 1;
    default:
      return true;
  }
}

Bytes make_parent(const StridedView& view, int64_t element_size, uint64_t seed) {
  Bytes parent(static_cast<size_t>(view.parent_elements * element_size));
  std::mt19937_64 rng(seed);
  for (auto& byte : parent) byte = static_cast<std::byte>(rng() % 255 + 1);
  return parent;
}

Bytes gather(const StridedView& view, int64_t element_size, const Bytes& parent) {
  Bytes dense;
  const Shape4& n = view.shape;
  for (int64_t i0 = 0; i0 < n[0]; ++i0)
    for (int64_t i1 = 0; i1 < n[1]; ++i1)
      for (int64_t i2 = 0; i2 < n[2]; ++i2)
        for (int64_t i3 = 0; i3 < n[3]; ++i3) {
          const std::byte* at = parent.data() + element_of(view, {i0, i1, i2, i3}) * element_size;
          dense.insert(dense.end(), at, at + element_size);
        }
  return dense;
}

std::vector<std::optional<StridedView>> packed_views(const Case& c, Packing packing, bool mixed) {
  std::vector<std::optional<StridedView>> views(c.world_size());
  for (int r = 0; r < c.world_size(); ++r) {
    if (mixed && r % 2 == 0) continue;
    const Shape4 shape = fast_ulysses::make_plan(request_for(c, r)).input_shape;
    views[r] = packed_view(c.layout, shape, packing, r % 3);
  }
  return views;
}

AssertionResult strided_matches_reference(const Case& c,
                                          const std::vector<std::optional<StridedView>>& views,
                                          uint64_t seed) {
  const int P = c.world_size();
  const int64_t es = c.element_size;
  RankBuffers parents(P), dense(P);
  std::vector<Plan> strided, contiguous;
  for (int r = 0; r < P; ++r) {
    const auto request = request_for(c, r);
    contiguous.push_back(fast_ulysses::make_plan(request));
    StridedView whole{contiguous[r].input_shape,
                      fast_ulysses::contiguous_strides(contiguous[r].input_shape)};
    whole.parent_elements = contiguous[r].input_bytes / es;
    const StridedView& view = views[r] ? *views[r] : whole;
    if (view.shape != contiguous[r].input_shape)
      return AssertionFailure() << "rank " << r << ": the view's shape is not the input shape";
    parents[r] = make_parent(view, es, seed * 1009 + r);
    dense[r] = gather(view, es, parents[r]);
    strided.push_back(views[r] ? fast_ulysses::make_plan(request, view.strides)
                               : fast_ulysses::make_plan(request));
    if (strided[r].request_hash != contiguous[r].request_hash)
      return AssertionFailure() << "rank " << r << ": the strides changed the request hash";
  }
  const Executed want = execute_plans(contiguous, dense, std::byte{0});
  RankBuffers windows(P, Bytes(strided[0].window_bytes, std::byte{0}));
  for (int r = 0; r < P; ++r) {
    const Source source = source_of(views[r], parents[r], es);
    if (strided[r].input_span_bytes > source.bytes)
      return AssertionFailure() << "rank " << r << ": span " << strided[r].input_span_bytes
                                << " past the parent's " << source.bytes << " bytes";
    if (auto ok = strided_copies_ok(strided[r]); !ok) return ok << " (rank " << r << ")";
    for (const auto& copy : strided[r].copies)
      fast_ulysses::execute_on_host(copy, source.data, source.bytes, windows[copy.peer].data(),
                                    static_cast<int64_t>(windows[copy.peer].size()));
  }
  if (auto same = same_bytes(windows, want.windows); !same) return same << " (windows)";
  const RankBuffers expected = reference_all_to_all(c, dense);
  if (auto same = same_bytes(want.outputs, expected); !same) return same << " (reference)";
  for (int r = 0; r < P; ++r) {
    const Bytes owned = owned_result(strided[r], source_of(views[r], parents[r], es), windows[r]);
    if (auto same = same_bytes({owned}, {expected[r]}); !same)
      return same << " (rank " << r << ": owned result)";
  }
  return AssertionSuccess();
}

}  // namespace fu_test
