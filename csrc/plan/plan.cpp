#include "plan/plan.h"

#include "plan/call_signature.h"

#include <algorithm>
#include <numeric>
#include <sstream>
#include <utility>

namespace fast_ulysses {
namespace {

template <typename... Parts>
[[noreturn]] void fail(const Parts&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw PlanError(message.str());
}

std::string join(const std::vector<int64_t>& values) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < values.size(); ++i) out << (i ? ", " : "") << values[i];
  out << "]";
  return out.str();
}

int64_t sum(const std::vector<int64_t>& values) {
  return std::accumulate(values.begin(), values.end(), int64_t{0});
}

int64_t prefix(const std::vector<int64_t>& values, int upto) {
  return std::accumulate(values.begin(), values.begin() + upto, int64_t{0});
}

// Splits `total` as evenly as possible, larger parts first: what we suggest in error messages.
std::vector<int64_t> balanced_split(int64_t total, int parts) {
  std::vector<int64_t> split(parts, total / parts);
  for (int i = 0; i < total % parts; ++i) ++split[i];
  return split;
}

void check_splits(const char* name, const std::vector<int64_t>& splits, int world_size) {
  if (static_cast<int>(splits.size()) != world_size)
    fail(name, " has ", splits.size(), " entries ", join(splits), ": it needs one per rank (",
         world_size, ")");
  for (size_t i = 0; i < splits.size(); ++i) {
    if (splits[i] < 0) fail(name, "[", i, "]=", splits[i], ": entries must be >= 0");
    // Bounded entries keep every sum below exactly representable int64 (no overflow).
    if (splits[i] > kMaxBytes) fail(name, "[", i, "]=", splits[i], ": entries must be <= 2^50");
  }
  if (sum(splits) <= 0) fail(name, "=", join(splits), ": the total must be positive");
}

// Shapes in layout order. `seq` is the sequence extent, `heads` the head extent.
std::array<int64_t, 4> shape_of(Layout layout, int64_t batch, int64_t seq, int64_t heads,
                                int64_t head_dim) {
  if (layout == Layout::kSBHD) return {seq, batch, heads, head_dim};
  if (layout == Layout::kBHSD) return {batch, heads, seq, head_dim};
  return {batch, seq, heads, head_dim};
}

// Where batch, sequence and heads sit in a 4-d shape of `layout` (head_dim is always last).
struct Dims {
  int batch, seq, heads;
};
Dims dims_of(Layout layout) {
  if (layout == Layout::kSBHD) return {1, 0, 2};
  if (layout == Layout::kBHSD) return {0, 2, 1};
  return {0, 1, 2};
}

std::string join(const std::array<int64_t, 4>& values) {
  return join(std::vector<int64_t>(values.begin(), values.end()));
}

bool empty(const Shape4& shape) {
  return std::any_of(shape.begin(), shape.end(), [](int64_t n) { return n == 0; });
}

// The strides the copies use: `strides` with every extent-1 dimension's (and an empty tensor's
// every) stride replaced by its contiguous stride, which no copy depends on; so the strides of a
// tensor torch calls contiguous give exactly the contiguous plan, and its plan key.
Strides normalised(const Shape4& shape, const Strides& strides) {
  const Strides dense = contiguous_strides(shape);
  Strides out = strides;
  for (size_t k = 0; k < 4; ++k)
    if (shape[k] == 1 || empty(shape)) out[k] = dense[k];
  return out;
}

// The extents and element strides of batch, sequence and heads, and head_dim.
struct Geometry {
  int64_t b, s, h, d;  // extents
  int64_t sb, ss, sh;  // element strides
};

Geometry geometry_of(Layout layout, const Shape4& shape, const Strides& st) {
  const Dims dims = dims_of(layout);
  return {shape[dims.batch], shape[dims.seq], shape[dims.heads], shape[3],
          st[dims.batch],    st[dims.seq],    st[dims.heads]};
}

// bhsd's rule: a copy's row is a run of one head's sequence rows.
std::string bhsd_rule(const Geometry& g) {
  std::ostringstream why;
  if (g.s > 1 && g.ss != g.d)
    why << "seq stride=" << g.ss << ": a head's sequence rows must abut (stride head_dim=" << g.d
        << ")";
  else if (g.h > 1 && g.sh < g.s * g.d)
    why << "heads stride=" << g.sh << ": a head's " << g.s << " rows must not overlap the next"
        << " head's (stride >= seq * head_dim=" << g.s * g.d << ")";
  else if (g.b > 1 && g.sb < (g.h > 1 ? g.h * g.sh : g.s * g.d))
    why << "batch stride=" << g.sb
        << ": batch elements must not overlap (stride >= " << (g.h > 1 ? g.h * g.sh : g.s * g.d)
        << ")";
  return why.str();
}

// bshd's and sbhd's rule: a copy's row is a run of one token's heads (in sbhd with b > 1, of one
// (token, batch) pair: the batch folds into the rows).
std::string token_rule(bool sbhd, const Geometry& g) {
  const bool folded = sbhd && g.b > 1;
  const int64_t pitch = folded ? g.sb : g.ss;  // from one row to the next
  std::ostringstream why;
  if (g.h > 1 && g.sh != g.d)
    why << "heads stride=" << g.sh << ": a token's heads must abut (stride head_dim=" << g.d << ")";
  else if (folded && g.s > 1 && g.ss != g.b * g.sb)
    why << "seq stride=" << g.ss << " with batch stride=" << g.sb << ": sbhd rows are (token, "
        << "batch) pairs, so the seq stride must be batch=" << g.b << " times the batch stride";
  else if ((folded || g.s > 1) && pitch < g.h * g.d)
    why << (folded ? "batch" : "seq") << " stride=" << pitch << ": rows of " << g.h
        << " heads x head_dim " << g.d << " must not overlap (stride >= " << g.h * g.d << ")";
  else if (!sbhd && g.b > 1 && g.sb < (g.s > 1 ? g.s * g.ss : g.h * g.d))
    why << "batch stride=" << g.sb
        << ": batch elements must not overlap (stride >= " << (g.s > 1 ? g.s * g.ss : g.h * g.d)
        << ")";
  return why.str();
}

}  // namespace

Layout parse_layout(const std::string& name) {
  for (Layout layout : kLayouts)
    if (name == layout_name(layout)) return layout;
  fail("layout='", name, "': must be 'bshd', 'sbhd' or 'bhsd'");
}

const char* layout_name(Layout layout) {
  if (layout == Layout::kSBHD) return "sbhd";
  if (layout == Layout::kBHSD) return "bhsd";
  return "bshd";
}

Mode parse_mode(int64_t mode) {
  if (mode == 0) return Mode::kSeqToHead;
  if (mode == 1) return Mode::kHeadToSeq;
  fail("mode=", mode, ": must be 0 (sequence -> heads) or 1 (heads -> sequence)");
}

int64_t CopyDescriptor::src_extent() const {
  if (bytes() == 0) return 0;
  return src_offset + (depth - 1) * src_slice_pitch + (height - 1) * src_pitch + width;
}

int64_t CopyDescriptor::dst_extent() const {
  if (bytes() == 0) return 0;
  return dst_offset + (depth - 1) * dst_slice_pitch + (height - 1) * dst_pitch + width;
}

CopyDescriptor coalesced(CopyDescriptor c) {
  if (c.bytes() == 0) return c;
  for (bool changed = true; changed;) {
    changed = false;
    if (c.depth > 1 && c.height == 1) {  // one row per slice: the slices are the rows
      c.height = c.depth;
      c.src_pitch = c.src_slice_pitch;
      c.dst_pitch = c.dst_slice_pitch;
      c.depth = 1;
      changed = true;
    }
    if (c.depth > 1 && c.src_slice_pitch == c.height * c.src_pitch &&
        c.dst_slice_pitch == c.height * c.dst_pitch) {  // slices abut: more rows
      c.height *= c.depth;
      c.depth = 1;
      changed = true;
    }
    if (c.height > 1 && c.src_pitch == c.width && c.dst_pitch == c.width) {  // rows abut
      c.width *= c.height;
      c.height = 1;
      changed = true;
    }
  }
  if (c.height == 1) c.src_pitch = c.dst_pitch = c.width;
  if (c.depth == 1) {
    c.src_slice_pitch = c.height * c.src_pitch;
    c.dst_slice_pitch = c.height * c.dst_pitch;
  }
  return c;
}

void check_world_size_and_rank(int64_t world_size, int64_t rank) {
  if (world_size < 1 || world_size > kMaxWorldSize)
    fail("world_size=", world_size, ": must be in [1, ", kMaxWorldSize, "] (one node)");
  if (rank < 0 || rank >= world_size)
    fail("rank=", rank, ": must be in [0, world_size=", world_size, ")");
}

void validate(const PlanRequest& request) {
  const int P = request.world_size;
  if (request.mode != Mode::kSeqToHead && request.mode != Mode::kHeadToSeq)
    fail("mode=", static_cast<int>(request.mode), ": must be 0 or 1");
  if (request.layout != Layout::kBSHD && request.layout != Layout::kSBHD &&
      request.layout != Layout::kBHSD)
    fail("layout=", static_cast<int>(request.layout), ": must be bshd (0), sbhd (1) or bhsd (2)");
  check_world_size_and_rank(P, request.rank);
  if (request.batch < 1) fail("batch=", request.batch, ": must be >= 1");
  if (request.head_dim < 1) fail("head_dim=", request.head_dim, ": must be >= 1");
  // Bounded before head_dim * element_size below, which would otherwise overflow int64.
  if (request.head_dim > kMaxBytes) fail("head_dim=", request.head_dim, ": must be <= 2^50");
  const int64_t es = request.element_size;
  if (es != 1 && es != 2 && es != 4) fail("element_size=", es, ": must be 1, 2 or 4 bytes");
  check_splits("seq_splits", request.seq_splits, P);
  check_splits("head_splits", request.head_splits, P);
  // Keep every byte offset far inside int64 (and inside what the copy APIs take as size_t).
  const long double total = static_cast<long double>(request.batch) * sum(request.seq_splits) *
                            sum(request.head_splits) * request.head_dim * es;
  if (total > static_cast<long double>(kMaxBytes))
    fail("tensor of ", total, " bytes: larger than the 2^50-byte limit");
}

Strides contiguous_strides(const Shape4& shape) {
  Strides strides{};
  int64_t step = 1;
  for (int k = 3; k >= 0; --k) {
    strides[k] = step;
    step *= shape[k];
  }
  return strides;
}

std::string irregular_strides_reason(Layout layout, const Shape4& shape, const Strides& strides,
                                     int64_t element_size) {
  const std::string what = std::string("strides ") + join(strides) + " of shape " + join(shape) +
                           " (" + layout_name(layout) + ")";
  // Shape and strides in long double first: nothing below overflows once these hold.
  long double dense = element_size, span = 0;
  for (size_t k = 0; k < 4; ++k) {
    if (shape[k] < 0) return what + ": extents must be >= 0";
    dense *= std::max<int64_t>(shape[k], 1);
  }
  if (element_size < 1 || dense > static_cast<long double>(kMaxBytes))
    return what + ": the shape is past the 2^50-byte limit";
  if (empty(shape)) return "";  // no element to read: any strides will do
  const Strides st = normalised(shape, strides);
  for (size_t k = 0; k < 4; ++k) {
    if (st[k] < 0) return what + ": strides must be >= 0";
    span += static_cast<long double>(shape[k] - 1) * st[k];
  }
  if ((span + 1) * element_size > static_cast<long double>(kMaxBytes))
    return what + ": its elements span more than 2^50 bytes";
  const Geometry g = geometry_of(layout, shape, st);
  std::string why;
  if (g.d > 1 && st[3] != 1)
    why = "stride[3]=" + std::to_string(st[3]) + ": a head's elements must be adjacent (stride 1)";
  else
    why = layout == Layout::kBHSD ? bhsd_rule(g) : token_rule(layout == Layout::kSBHD, g);
  return why.empty() ? why : what + ": " + why;
}

bool regular_input_strides(Layout layout, const Shape4& shape, const Strides& strides,
                           int64_t element_size) {
  return irregular_strides_reason(layout, shape, strides, element_size).empty();
}

namespace {

// The peers' chunks in my window, before and after my own along the gathered dimension (rows in
// mode 0, heads in mode 1). When the gathered dimension is outer to the other one within a slice
// (bshd/sbhd mode 0, bhsd mode 1) the chunks are bands of whole lines; otherwise (bshd/sbhd
// mode 1, bhsd mode 0) they are columns of every line.
void add_collect(Plan& plan) {
  const PlanRequest& request = plan.request;
  const int r = request.rank;
  const CopyDescriptor& own = plan.copies[r];  // its dst side is my chunk in my window
  const bool to_heads = request.mode == Mode::kSeqToHead;
  // The gathered dimension: sequence rows in mode 0, heads in mode 1.
  const auto& gathered = to_heads ? request.seq_splits : request.head_splits;
  const int64_t total = sum(gathered);
  const int64_t begin = prefix(gathered, r);
  const int64_t end = begin + gathered[r];
  const bool bhsd = request.layout == Layout::kBHSD;
  const int64_t row = request.head_dim * request.element_size;
  CopyDescriptor base;
  base.peer = r;
  base.depth = own.depth;
  if (to_heads != bhsd) {  // bands: each slice of my window is `total` abutting units
    // A unit: a sequence row of my heads (bshd, sbhd: fold rows of heads[r] heads) or a head of
    // my rows (bhsd: seq[r] rows).
    const int64_t fold = request.layout == Layout::kSBHD ? request.batch : 1;
    const int64_t unit = bhsd ? request.seq_splits[r] * row : fold * request.head_splits[r] * row;
    base.height = 1;
    base.src_slice_pitch = base.dst_slice_pitch = own.dst_slice_pitch;
    for (const auto& [from, to] : {std::pair{int64_t{0}, begin}, std::pair{end, total}}) {
      CopyDescriptor c = base;
      c.src_offset = c.dst_offset = from * unit;
      c.width = c.src_pitch = c.dst_pitch = (to - from) * unit;
      if (c.bytes() > 0) plan.collect.push_back(c);
    }
  } else {  // columns: every line of my window is `total` units of `row` bytes; mine are
            // [begin, end) of each (a line: a token's N heads, or a head's S rows in bhsd)
    base.height = own.height;
    base.src_pitch = base.dst_pitch = total * row;
    base.src_slice_pitch = base.dst_slice_pitch = own.height * total * row;
    for (const auto& [from, to] : {std::pair{int64_t{0}, begin}, std::pair{end, total}}) {
      CopyDescriptor c = base;
      c.src_offset = c.dst_offset = from * row;
      c.width = (to - from) * row;
      if (c.bytes() > 0) plan.collect.push_back(c);
    }
  }
}

// Rank r's copy to peer j but its source side: extents, and where its bytes land in j's window.
CopyDescriptor destination_of(const PlanRequest& request, int j) {
  const int r = request.rank;
  const auto& seq = request.seq_splits;
  const auto& heads = request.head_splits;
  const int64_t S = sum(seq), N = sum(heads);
  const int64_t row = request.head_dim * request.element_size;  // bytes of one head of one token
  // sbhd folds the batch into the sequence rows: a (token, batch) pair is one row, one slice.
  // bshd keeps rows per batch element and walks the batch as slices. One code path for both.
  const int64_t fold = request.layout == Layout::kSBHD ? request.batch : 1;
  CopyDescriptor c;
  c.peer = j;
  c.depth = request.layout == Layout::kSBHD ? 1 : request.batch;
  const bool to_heads = request.mode == Mode::kSeqToHead;
  if (request.layout == Layout::kBHSD) {
    // bhsd keeps a head's rows together: per batch element (a slice) and per head (a row of the
    // copy), one run of sequence rows; the relayout is the same strides turned around.
    // Mode 0: my rows of every head of j, into my rows of j's heads (S rows per head there).
    // Mode 1: j's rows of each of my heads, into my heads of j (seq[j] rows per head there).
    const int64_t rows = to_heads ? S : seq[j];  // sequence rows per head in j's window
    c.width = (to_heads ? seq[r] : seq[j]) * row;
    c.height = to_heads ? heads[j] : heads[r];
    c.dst_offset = to_heads ? prefix(seq, r) * row : prefix(heads, r) * seq[j] * row;
    c.dst_pitch = rows * row;
    c.dst_slice_pitch = (to_heads ? heads[j] : N) * rows * row;
  } else if (to_heads) {
    // Heads of j from every one of my rows, into j's rows of mine.
    c.width = heads[j] * row;
    c.height = seq[r] * fold;
    c.dst_offset = prefix(seq, r) * fold * heads[j] * row;
    c.dst_pitch = heads[j] * row;
    c.dst_slice_pitch = S * fold * heads[j] * row;
  } else {
    // j's rows of all my heads, into my heads of j's rows.
    c.width = heads[r] * row;
    c.height = seq[j] * fold;
    c.dst_offset = prefix(heads, r) * row;
    c.dst_pitch = N * row;
    c.dst_slice_pitch = seq[j] * fold * N * row;
  }
  return c;
}

// The source side of the copy to peer j, from the input's element strides (plan.input_strides,
// regular): the chunk starts at j's first head (mode 0) or j's first sequence row (mode 1); a
// row of the copy is one token (bshd), one (token, batch) pair (sbhd) or one head (bhsd); a slice
// is one batch element (bshd, bhsd; sbhd has one slice, the whole input). Contiguous strides
// give exactly the pitches of a dense input.
void set_source(CopyDescriptor& c, const Plan& plan, int j) {
  const PlanRequest& request = plan.request;
  const int64_t es = request.element_size;
  const Geometry g = geometry_of(request.layout, plan.input_shape, plan.input_strides);
  const bool sbhd = request.layout == Layout::kSBHD;
  c.src_offset = request.mode == Mode::kSeqToHead ? prefix(request.head_splits, j) * g.sh * es
                                                  : prefix(request.seq_splits, j) * g.ss * es;
  if (request.layout == Layout::kBHSD)
    c.src_pitch = g.sh * es;
  else
    c.src_pitch = (sbhd && g.b > 1 ? g.sb : g.ss) * es;
  c.src_slice_pitch = sbhd ? g.s * std::max<int64_t>(g.b, 1) * c.src_pitch : g.sb * es;
}

int64_t span_bytes(const Shape4& shape, const Strides& strides, int64_t element_size) {
  if (empty(shape)) return 0;
  int64_t last = 0;
  for (size_t k = 0; k < 4; ++k) last += (shape[k] - 1) * strides[k];
  return (last + 1) * element_size;
}

}  // namespace

Plan make_plan(const PlanRequest& request, const std::optional<Strides>& input_strides) {
  validate(request);
  const int P = request.world_size;
  const int r = request.rank;
  const auto& seq = request.seq_splits;
  const auto& heads = request.head_splits;
  const int64_t S = sum(seq);
  const int64_t N = sum(heads);
  const int64_t row = request.head_dim * request.element_size;

  Plan plan;
  plan.request = request;
  plan.request_hash = fast_ulysses::request_hash(request);  // the strides are not in it
  const bool to_heads = request.mode == Mode::kSeqToHead;
  for (int j = 0; j < P; ++j) {
    const int64_t out_j = request.batch * (to_heads ? S * heads[j] : seq[j] * N) * row;
    plan.window_bytes = std::max(plan.window_bytes, out_j);
  }
  const int64_t local_seq = to_heads ? seq[r] : S, local_heads = to_heads ? N : heads[r];
  const int64_t out_seq = to_heads ? S : seq[r], out_heads = to_heads ? heads[r] : N;
  plan.input_shape =
      shape_of(request.layout, request.batch, local_seq, local_heads, request.head_dim);
  plan.output_shape = shape_of(request.layout, request.batch, out_seq, out_heads, request.head_dim);
  plan.input_bytes = request.batch * local_seq * local_heads * row;
  plan.output_bytes = request.batch * out_seq * out_heads * row;
  const Strides dense = contiguous_strides(plan.input_shape);
  if (input_strides) {
    const std::string why = irregular_strides_reason(request.layout, plan.input_shape,
                                                     *input_strides, request.element_size);
    if (!why.empty()) fail("input ", why);
  }
  plan.input_strides = normalised(plan.input_shape, input_strides.value_or(dense));
  plan.input_span_bytes = span_bytes(plan.input_shape, plan.input_strides, request.element_size);

  plan.copies.reserve(P);
  for (int j = 0; j < P; ++j) {
    plan.copies.push_back(destination_of(request, j));
    set_source(plan.copies.back(), plan, j);
  }
  add_collect(plan);
  return plan;
}

PlanRequest request_from_shape(int world_size, int rank, Mode mode, Layout layout,
                               const std::vector<int64_t>& input_shape, int64_t element_size,
                               const std::optional<std::vector<int64_t>>& seq_splits,
                               const std::optional<std::vector<int64_t>>& head_splits) {
  if (input_shape.size() != 4)
    fail("input shape ", join(input_shape), ": must have 4 dimensions (", layout_name(layout), ")");
  for (size_t i = 0; i < 4; ++i)
    if (input_shape[i] < 0) fail("input shape ", join(input_shape), ": negative dimension");
  check_world_size_and_rank(world_size, rank);

  PlanRequest request;
  request.world_size = world_size;
  request.rank = rank;
  request.mode = mode;
  request.layout = layout;
  const Dims dims = dims_of(layout);
  request.batch = input_shape[dims.batch];
  const int64_t seq_dim = input_shape[dims.seq];
  const int64_t head_dim_extent = input_shape[dims.heads];
  request.head_dim = input_shape[3];
  request.element_size = element_size;

  // In mode 0 the input holds my rows and all heads; in mode 1 all rows and my heads.
  const bool to_heads = mode == Mode::kSeqToHead;
  const char* local_name = to_heads ? "seq_splits" : "head_splits";
  const char* total_name = to_heads ? "head_splits" : "seq_splits";
  const char* local_what = to_heads ? "sequence rows" : "heads";
  const char* total_what = to_heads ? "heads" : "sequence rows";
  const int64_t local = to_heads ? seq_dim : head_dim_extent;
  const int64_t total = to_heads ? head_dim_extent : seq_dim;
  const auto& local_given = to_heads ? seq_splits : head_splits;
  const auto& total_given = to_heads ? head_splits : seq_splits;

  std::vector<int64_t> local_splits(world_size, local);
  if (local_given) {
    local_splits = *local_given;
    check_splits(local_name, local_splits, world_size);
    if (local_splits[rank] != local)
      fail(local_name, "[", rank, "]=", local_splits[rank], " but this rank's input ",
           join(input_shape), " holds ", local, " ", local_what, " (mode ", static_cast<int>(mode),
           ", ", layout_name(layout), ")");
  }
  std::vector<int64_t> total_splits;
  if (total_given) {
    total_splits = *total_given;
    check_splits(total_name, total_splits, world_size);
    if (sum(total_splits) != total)
      fail(total_name, "=", join(total_splits), " sums to ", sum(total_splits), " but the input ",
           join(input_shape), " has ", total, " ", total_what);
  } else {
    if (total % world_size != 0)
      fail("the input ", join(input_shape), " has ", total, " ", total_what,
           ", which world_size=", world_size, " does not divide: pass ", total_name, " (e.g. ",
           join(balanced_split(total, world_size)), ")");
    total_splits.assign(world_size, total / world_size);
  }
  request.seq_splits = to_heads ? local_splits : total_splits;
  request.head_splits = to_heads ? total_splits : local_splits;
  validate(request);
  return request;
}

}  // namespace fast_ulysses
