#include "reference.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <sstream>

#include "plan/host_executor.h"

namespace fu_test {
namespace {

using fast_ulysses::Layout;
using fast_ulysses::Mode;

int64_t total(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t{0});
}

int64_t offset_of(const std::vector<int64_t>& v, int rank) {
  return std::accumulate(v.begin(), v.begin() + rank, int64_t{0});
}

std::string join(const std::vector<int64_t>& v) {
  std::ostringstream out;
  for (size_t i = 0; i < v.size(); ++i) out << (i ? "," : "[") << v[i];
  out << "]";
  return out.str();
}

// A (batch, seq, heads, head_dim) tensor of `element_size`-byte elements stored in `layout`:
// bshd is [batch][seq][heads][d], sbhd is [seq][batch][heads][d], bhsd is [batch][heads][seq][d].
struct Tensor4d {
  Layout layout;
  int64_t batch, seq, heads, head_dim, element_size;

  int64_t bytes() const { return batch * seq * heads * head_dim * element_size; }
  int64_t element(int64_t bb, int64_t s, int64_t h, int64_t e) const {
    int64_t line = 0;  // index of the d-vector
    if (layout == Layout::kSBHD)
      line = (s * batch + bb) * heads + h;
    else if (layout == Layout::kBHSD)
      line = (bb * heads + h) * seq + s;
    else
      line = (bb * seq + s) * heads + h;
    return (line * head_dim + e) * element_size;
  }
  // The inverse of element(): (bb, s, h, e) and the byte within the element.
  struct Index {
    int64_t bb, s, h, e, k;
  };
  Index index(int64_t byte) const {
    Index at{};
    at.k = byte % element_size;
    int64_t rest = byte / element_size;
    at.e = rest % head_dim;
    rest /= head_dim;
    if (layout == Layout::kBHSD) {
      at.s = rest % seq;
      rest /= seq;
      at.h = rest % heads;
      at.bb = rest / heads;
      return at;
    }
    at.h = rest % heads;
    const int64_t outer = rest / heads;
    at.bb = layout == Layout::kSBHD ? outer % batch : outer / seq;
    at.s = layout == Layout::kSBHD ? outer / batch : outer % seq;
    return at;
  }
};

// The rank whose range of `splits` holds global index `global`.
int owner_of(const std::vector<int64_t>& splits, int64_t global) {
  int rank = 0;
  while (global >= splits[rank]) global -= splits[rank++];
  return rank;
}

// Rank r's tensors: before mode 0 it holds its rows and all heads, after it all rows, its heads.
Tensor4d rows_tensor(const Case& c, int r) {
  return {c.layout, c.batch, c.seq_splits[r], total(c.head_splits), c.head_dim, c.element_size};
}
Tensor4d heads_tensor(const Case& c, int r) {
  return {c.layout, c.batch, total(c.seq_splits), c.head_splits[r], c.head_dim, c.element_size};
}

Tensor4d input_tensor(const Case& c, int r) {
  return c.mode == Mode::kSeqToHead ? rows_tensor(c, r) : heads_tensor(c, r);
}
Tensor4d output_tensor(const Case& c, int r) {
  return c.mode == Mode::kSeqToHead ? heads_tensor(c, r) : rows_tensor(c, r);
}

// The block of rank i's rows and rank j's heads, element by element, between rows_tensor(i)
// (at row s, head head_off(j) + h) and heads_tensor(j) (at row row_off(i) + s, head h).
// rows_to_heads: src is rank i's rows tensor, dst rank j's heads tensor; else the reverse.
void move_block(const Case& c, int i, int j, const std::byte* src, std::byte* dst,
                bool rows_to_heads) {
  const Tensor4d rt = rows_tensor(c, i);
  const Tensor4d ht = heads_tensor(c, j);
  const int64_t row_off = offset_of(c.seq_splits, i);
  const int64_t head_off = offset_of(c.head_splits, j);
  for (int64_t bb = 0; bb < c.batch; ++bb)
    for (int64_t s = 0; s < c.seq_splits[i]; ++s)
      for (int64_t h = 0; h < c.head_splits[j]; ++h)
        for (int64_t e = 0; e < c.head_dim; ++e) {
          const int64_t in_rows = rt.element(bb, s, head_off + h, e);
          const int64_t in_heads = ht.element(bb, row_off + s, h, e);
          if (rows_to_heads)
            std::memcpy(dst + in_heads, src + in_rows, c.element_size);
          else
            std::memcpy(dst + in_rows, src + in_heads, c.element_size);
        }
}

}  // namespace

std::string describe(const Case& c) {
  std::ostringstream out;
  out << "P=" << c.world_size() << " mode=" << static_cast<int>(c.mode)
      << " layout=" << fast_ulysses::layout_name(c.layout) << " b=" << c.batch
      << " d=" << c.head_dim << " es=" << c.element_size << " seq_splits=" << join(c.seq_splits)
      << " head_splits=" << join(c.head_splits);
  return out.str();
}

int64_t reference_input_bytes(const Case& c, int rank) {
  return input_tensor(c, rank).bytes();
}
int64_t reference_output_bytes(const Case& c, int rank) {
  return output_tensor(c, rank).bytes();
}

RankBuffers reference_all_to_all(const Case& c, const RankBuffers& inputs) {
  const int P = c.world_size();
  RankBuffers outputs(P);
  for (int r = 0; r < P; ++r) outputs[r].assign(reference_output_bytes(c, r), std::byte{0});
  // Mode 0: sender i's rows -> receiver j's heads. Mode 1: sender j's heads -> receiver i's rows.
  const bool to_heads = c.mode == Mode::kSeqToHead;
  for (int i = 0; i < P; ++i)
    for (int j = 0; j < P; ++j)
      if (to_heads)
        move_block(c, i, j, inputs[i].data(), outputs[j].data(), true);
      else
        move_block(c, i, j, inputs[j].data(), outputs[i].data(), false);
  return outputs;
}

SourceByte reference_source_of(const Case& c, int receiver, int64_t out_byte) {
  const Tensor4d out = output_tensor(c, receiver);
  const auto at = out.index(out_byte);
  if (c.mode == Mode::kSeqToHead) {  // out is receiver j's heads; row s came from its owner i
    const int i = owner_of(c.seq_splits, at.s);
    const int64_t s = at.s - offset_of(c.seq_splits, i);
    const int64_t h = offset_of(c.head_splits, receiver) + at.h;
    return {i, rows_tensor(c, i).element(at.bb, s, h, at.e) + at.k};
  }
  // Mode 1: out is receiver i's rows; head h came from its owner j.
  const int j = owner_of(c.head_splits, at.h);
  const int64_t s = offset_of(c.seq_splits, receiver) + at.s;
  const int64_t h = at.h - offset_of(c.head_splits, j);
  return {j, heads_tensor(c, j).element(at.bb, s, h, at.e) + at.k};
}

fast_ulysses::PlanRequest request_for(const Case& c, int rank) {
  fast_ulysses::PlanRequest request;
  request.world_size = c.world_size();
  request.rank = rank;
  request.mode = c.mode;
  request.layout = c.layout;
  request.batch = c.batch;
  request.head_dim = c.head_dim;
  request.element_size = c.element_size;
  request.seq_splits = c.seq_splits;
  request.head_splits = c.head_splits;
  return request;
}

std::vector<fast_ulysses::Plan> make_plans(const Case& c) {
  std::vector<fast_ulysses::Plan> plans;
  for (int r = 0; r < c.world_size(); ++r)
    plans.push_back(fast_ulysses::make_plan(request_for(c, r)));
  return plans;
}

Executed execute_plans(const std::vector<fast_ulysses::Plan>& plans, const RankBuffers& inputs,
                       std::byte sentinel) {
  const int P = static_cast<int>(plans.size());
  Executed result;
  result.windows.assign(P, Bytes(plans[0].window_bytes, sentinel));
  for (int r = 0; r < P; ++r)
    for (const auto& copy : plans[r].copies)
      fast_ulysses::execute_on_host(copy, inputs[r].data(), static_cast<int64_t>(inputs[r].size()),
                                    result.windows[copy.peer].data(),
                                    static_cast<int64_t>(result.windows[copy.peer].size()));
  for (int j = 0; j < P; ++j) {
    const auto& window = result.windows[j];
    result.outputs.emplace_back(window.begin(), window.begin() + plans[j].output_bytes);
  }
  return result;
}

RankBuffers run_plans(const Case& c, const RankBuffers& inputs) {
  return execute_plans(make_plans(c), inputs, std::byte{0}).outputs;
}

}  // namespace fu_test
