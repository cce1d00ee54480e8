// Fuzz test of the plan (make_plan, request_from_shape, the collect copies, coalesced()), meant to
// run under AddressSanitizer and UndefinedBehaviorSanitizer (scripts/fuzz.sh):
//
//   fu_plan_fuzz [--inputs N] [--seed S] [--only I]
//
// Input I is drawn from its own generator seeded by (S, I), so `--seed S --only I` replays one
// input. Kinds: small valid cases, small cases with one field made adversarial, raw requests
// with every field drawn from edge values (negative, zero, 2^31, 2^50 +- 1, INT64_MIN/MAX, wrong
// split lengths, mode and layout values outside the enums, world sizes and ranks out of range),
// cases near the 2^50-byte limit, request_from_shape() with odd shapes and splits, and input
// strides (packed views, strides around the dense ones, edge values).
//
// The oracle: a request is accepted exactly when it keeps docs/API.md's limits (computed here in
// 128 bits), and anything thrown is a PlanError. An accepted call is checked on every rank: small
// ones executed on host buffers against the reference (plan_matches_reference,
// owned_matches_reference) and by arithmetic (plans_cover_exactly_once, which the byte-level
// checks thereby cross-check); large ones by arithmetic alone. Strides are accepted by make_plan
// exactly when irregular_strides_reason finds nothing; accepted views are executed against the
// reference (strided_matches_reference), or checked by arithmetic when too large. The first
// failure prints the input in full and how to replay it, and exits 1.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <typeinfo>
#include <vector>

#include "cases.h"
#include "checks.h"
#include "plan/plan.h"
#include "reference.h"
#include "strided.h"

namespace fu_test {
namespace {

using fast_ulysses::Layout;
using fast_ulysses::Mode;
using fast_ulysses::PlanRequest;
using Wide = __int128;

constexpr int64_t k2p50 = int64_t{1} << 50;
constexpr int64_t kMaterialiseBytes = int64_t{1} << 16;  // all ranks' inputs, for byte checks

uint64_t mix(uint64_t seed, uint64_t index) {
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + index + 0x632be59bd9b4e019ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

struct Draw {
  std::mt19937_64 rng;
  int64_t below(int64_t n) { return static_cast<int64_t>(rng() % static_cast<uint64_t>(n)); }
  bool one_in(int n) { return below(n) == 0; }
  int64_t edge() {  // a value that breaks careless arithmetic
    static const int64_t values[] = {0,
                                     1,
                                     -1,
                                     2,
                                     3,
                                     15,
                                     16,
                                     17,
                                     48,
                                     255,
                                     INT32_MAX,
                                     int64_t{INT32_MAX} + 1,
                                     int64_t{1} << 32,
                                     k2p50 / 16,
                                     k2p50 - 1,
                                     k2p50,
                                     k2p50 + 1,
                                     int64_t{1} << 62,
                                     INT64_MAX,
                                     INT64_MIN,
                                     INT64_MIN + 1,
                                     -k2p50,
                                     -16};
    return values[below(sizeof(values) / sizeof(values[0]))];
  }
  int64_t any() {
    switch (below(4)) {
      case 0:
        return edge();
      case 1:
        return below(9);
      case 2:
        return static_cast<int64_t>(rng());  // anything, sign included
      default:
        return below(int64_t{1} << (1 + below(52)));
    }
  }
  int world() {
    static const int values[] = {-1, 0, 9, 16, INT_MAX, INT_MIN};
    return one_in(4) ? values[below(6)] : static_cast<int>(below(8)) + 1;
  }
};

std::string join(const std::vector<int64_t>& v) {
  std::ostringstream out;
  out << "[";
  for (size_t i = 0; i < v.size(); ++i) out << (i ? ", " : "") << v[i];
  return out.str() + "]";
}

std::string show(const PlanRequest& r) {
  std::ostringstream out;
  out << "PlanRequest{world_size " << r.world_size << ", rank " << r.rank << ", mode "
      << static_cast<int>(r.mode) << ", layout " << static_cast<int>(r.layout) << ", batch "
      << r.batch << ", head_dim " << r.head_dim << ", element_size " << r.element_size
      << ", seq_splits " << join(r.seq_splits) << ", head_splits " << join(r.head_splits) << "}";
  return out.str();
}

Wide saturating_sum(const std::vector<int64_t>& v) {
  Wide s = 0;
  for (int64_t x : v) s += x;
  return s;
}

// docs/API.md's limits, independently of plan.cpp: accepted exactly when this holds.
bool keeps_the_limits(const PlanRequest& r) {
  const int mode = static_cast<int>(r.mode), layout = static_cast<int>(r.layout);
  if (mode < 0 || mode > 1 || layout < 0 || layout > 2) return false;
  if (r.world_size < 1 || r.world_size > fast_ulysses::kMaxWorldSize) return false;
  if (r.rank < 0 || r.rank >= r.world_size) return false;
  if (r.batch < 1 || r.head_dim < 1) return false;
  if (r.element_size != 1 && r.element_size != 2 && r.element_size != 4) return false;
  for (const auto* splits : {&r.seq_splits, &r.head_splits}) {
    if (static_cast<int>(splits->size()) != r.world_size) return false;
    for (int64_t x : *splits)
      if (x < 0 || x > k2p50) return false;
    if (saturating_sum(*splits) <= 0) return false;
  }
  // Each factor is at most 2^50 here and the running product stops past the limit: no overflow.
  Wide total = 1;
  for (Wide f : {Wide(r.batch), saturating_sum(r.seq_splits), saturating_sum(r.head_splits),
                 Wide(r.head_dim), Wide(r.element_size)}) {
    total *= f;
    if (total > k2p50) return false;
  }
  return true;
}

Case case_of(const PlanRequest& r) {
  return Case{r.mode, r.layout, r.batch, r.head_dim, r.element_size, r.seq_splits, r.head_splits};
}

// --- Input kinds. ---

PlanRequest small_valid(Draw& d) {
  std::mt19937_64 rng(d.rng());
  const Case c = random_case(rng);
  PlanRequest r = request_for(c, static_cast<int>(d.below(c.world_size())));
  return r;
}

PlanRequest mutated(Draw& d) {
  PlanRequest r = small_valid(d);
  switch (d.below(9)) {
    case 0:
      r.world_size = d.world();
      break;
    case 1:
      r.rank = d.one_in(2) ? r.world_size : static_cast<int>(d.any());
      break;
    case 2:
      r.mode = static_cast<Mode>(d.one_in(2) ? 2 : -1);
      break;
    case 3:
      r.layout = static_cast<Layout>(d.one_in(2) ? 3 : -3);
      break;
    case 4:
      r.batch = d.any();
      break;
    case 5:
      r.head_dim = d.any();
      break;
    case 6:
      r.element_size = d.any();
      break;
    case 7: {
      auto& splits = d.one_in(2) ? r.seq_splits : r.head_splits;
      if (d.one_in(3))
        splits.push_back(1);
      else if (d.one_in(2) && !splits.empty())
        splits.pop_back();
      else if (!splits.empty())
        splits[d.below(static_cast<int64_t>(splits.size()))] = d.any();
      break;
    }
    default:
      std::fill(r.head_splits.begin(), r.head_splits.end(), 0);
      break;
  }
  return r;
}

std::vector<int64_t> splits(Draw& d, int64_t n) {  // n entries, clamped to [0, 12]
  std::vector<int64_t> v(static_cast<size_t>(std::clamp<int64_t>(n, 0, 12)));
  for (auto& x : v) x = d.one_in(3) ? d.any() : d.below(5);
  return v;
}

PlanRequest raw(Draw& d) {
  PlanRequest r;
  r.world_size = d.world();
  r.rank = d.one_in(3) ? static_cast<int>(d.any()) : static_cast<int>(d.below(9)) - 1;
  r.mode = static_cast<Mode>(d.one_in(5) ? d.below(5) - 2 : d.below(2));
  r.layout = static_cast<Layout>(d.one_in(5) ? d.below(6) - 2 : d.below(3));
  r.batch = d.one_in(2) ? d.below(4) + 1 : d.any();
  r.head_dim = d.one_in(3) ? 8 * (d.below(4) + 1) : d.one_in(2) ? d.below(7) + 1 : d.any();
  r.element_size = d.one_in(2) ? int64_t{1} << d.below(3) : d.any();
  const int64_t length = int64_t{r.world_size} + (d.one_in(4) ? d.below(3) - 1 : 0);
  r.seq_splits = splits(d, length);
  r.head_splits = splits(d, d.one_in(8) ? length + 1 : length);
  return r;
}

// Near the limit: a few big factors whose product lands around 2^50 bytes.
PlanRequest huge(Draw& d) {
  PlanRequest r;
  r.world_size = static_cast<int>(d.below(8)) + 1;
  r.rank = static_cast<int>(d.below(r.world_size));
  r.mode = static_cast<Mode>(d.below(2));
  r.layout = static_cast<Layout>(d.below(3));
  r.element_size = int64_t{1} << d.below(3);
  const int64_t row_log2 = 2 + d.below(10);  // rows of 4 B .. 2 KiB, some of odd widths
  r.head_dim = (int64_t{1} << row_log2) / r.element_size;
  if (d.one_in(4) && r.head_dim > 1) r.head_dim -= 1;
  const int64_t batch_log2 = d.below(12);
  r.batch = int64_t{1} << batch_log2;
  // Spend the remaining bits (+-1 around the limit) between sequence and heads.
  const int64_t left = 50 - row_log2 - batch_log2 + (d.one_in(4) ? 1 : 0);
  const int64_t seq_log2 = d.below(std::max<int64_t>(left, 1));
  const int64_t head_log2 = std::max<int64_t>(left - seq_log2, 0);
  const auto split = [&](int64_t total_log2) {
    std::vector<int64_t> v(r.world_size, 0);
    int64_t total = int64_t{1} << total_log2;
    for (int i = 0; i + 1 < r.world_size && total > 0; ++i) {
      if (d.one_in(3)) continue;  // some ranks hold nothing
      const int64_t share = d.below(total + 1);
      v[i] = share;
      total -= share;
    }
    v[r.world_size - 1] += total;
    if (d.one_in(6)) v[d.below(r.world_size)] += d.below(3);  // off by a little
    return v;
  };
  r.seq_splits = split(seq_log2);
  r.head_splits = split(head_log2);
  return r;
}

// --- Checks. ---

struct Counts {
  int64_t accepted = 0, rejected = 0, materialised = 0, arithmetic = 0;
};

::testing::AssertionResult check_accepted(const PlanRequest& r, uint64_t seed, Counts& counts) {
  const Case c = case_of(r);
  const auto plans = make_plans(c);
  Wide all_inputs = 0;
  for (const auto& plan : plans) all_inputs += plan.input_bytes;
  if (all_inputs <= kMaterialiseBytes) {
    ++counts.materialised;
    if (auto ok = plan_matches_reference(c, seed); !ok) return ok << " (executed)";
    if (auto ok = owned_matches_reference(c, seed); !ok) return ok << " (owned result)";
    return plans_cover_exactly_once(c, plans, seed, 16);
  }
  ++counts.arithmetic;
  return plans_cover_exactly_once(c, plans, seed, 64);
}

::testing::AssertionResult check_request(const PlanRequest& r, uint64_t seed, Counts& counts) {
  const bool valid = keeps_the_limits(r);
  try {
    const auto plan = fast_ulysses::make_plan(r);
    if (!valid) return ::testing::AssertionFailure() << "accepted, but it breaks a limit";
    if (plan.copies.size() != r.seq_splits.size())
      return ::testing::AssertionFailure() << plan.copies.size() << " copies";
  } catch (const fast_ulysses::PlanError& error) {
    if (valid)
      return ::testing::AssertionFailure()
             << "rejected a request within the limits: " << error.what();
    ++counts.rejected;
    return ::testing::AssertionSuccess();
  }
  ++counts.accepted;
  return check_accepted(r, seed, counts);
}

::testing::AssertionResult check_from_shape(Draw& d, uint64_t seed, Counts& counts,
                                            std::string& input) {
  const int P = d.world();
  const int rank = d.one_in(4) ? static_cast<int>(d.any()) : static_cast<int>(d.below(9));
  const Mode mode = static_cast<Mode>(d.below(2));
  const Layout layout = static_cast<Layout>(d.below(3));
  std::vector<int64_t> shape(d.one_in(10) ? d.below(6) : 4);
  for (auto& x : shape) x = d.one_in(3) ? d.any() : d.below(9);
  if (shape.size() == 4 && d.one_in(2)) shape[3] = d.one_in(2) ? 8 * (d.below(3) + 1) : 1;
  const int64_t es = d.one_in(4) ? d.any() : int64_t{1} << d.below(3);
  std::optional<std::vector<int64_t>> seq, heads;
  if (d.one_in(2)) seq = splits(d, int64_t{P} + (d.one_in(6) ? 1 : 0));
  if (d.one_in(2)) heads = splits(d, int64_t{P} - (d.one_in(6) ? 1 : 0));
  std::ostringstream out;
  out << "request_from_shape(world_size " << P << ", rank " << rank << ", mode "
      << static_cast<int>(mode) << ", " << fast_ulysses::layout_name(layout) << ", shape "
      << join(shape) << ", element_size " << es << ", seq_splits " << (seq ? join(*seq) : "none")
      << ", head_splits " << (heads ? join(*heads) : "none") << ")";
  input = out.str();
  PlanRequest r;
  try {
    r = fast_ulysses::request_from_shape(P, rank, mode, layout, shape, es, seq, heads);
  } catch (const fast_ulysses::PlanError&) {
    ++counts.rejected;
    return ::testing::AssertionSuccess();
  }
  input += " -> " + show(r);
  if (!keeps_the_limits(r)) return ::testing::AssertionFailure() << "returned a bad request";
  const auto plan = fast_ulysses::make_plan(r);
  for (size_t i = 0; i < 4; ++i)
    if (plan.input_shape[i] != shape[i])
      return ::testing::AssertionFailure() << "plan input shape differs from the given shape";
  if ((seq && *seq != r.seq_splits) || (heads && *heads != r.head_splits))
    return ::testing::AssertionFailure() << "given splits were not kept";
  ++counts.accepted;
  return check_accepted(r, seed, counts);
}

// One rank's input strides: a packed view, strides around the dense ones, or edge values.
StridedView drawn_view(Draw& d, const Case& c, const fast_ulysses::Shape4& shape) {
  const int kind = static_cast<int>(d.below(3));
  if (kind == 0)
    return packed_view(c.layout, shape, kPackings[d.below(std::size(kPackings))],
                       static_cast<int>(d.below(3)));
  const fast_ulysses::Strides dense = fast_ulysses::contiguous_strides(shape);
  StridedView view{shape};
  for (size_t k = 0; k < 4; ++k) {
    const int64_t near[] = {0, 1, dense[k], 2 * dense[k], dense[k] + 1, c.head_dim};
    view.strides[k] = kind == 2 && d.one_in(2) ? d.edge() : near[d.below(6)];
  }
  view.offset = d.below(3);
  return view;
}

// Elements from the view's first to its last (0 when too many to hold).
int64_t parent_elements(const StridedView& view) {
  Wide last = view.offset;
  for (size_t k = 0; k < 4; ++k) {
    if (view.shape[k] == 0) return view.offset;
    last += Wide(view.shape[k] - 1) * view.strides[k];
  }
  return last < kMaterialiseBytes ? static_cast<int64_t>(last) + 1 : 0;
}

::testing::AssertionResult check_strided(Draw& d, uint64_t seed, Counts& counts,
                                         std::string& input) {
  std::mt19937_64 rng(d.rng());
  const Case c = random_case(rng);
  input = describe(c) + ", strides";
  std::vector<std::optional<StridedView>> views(c.world_size());
  for (int r = 0; r < c.world_size(); ++r) {
    const auto request = request_for(c, r);
    StridedView view = drawn_view(d, c, fast_ulysses::make_plan(request).input_shape);
    input +=
        " " + join({view.strides.begin(), view.strides.end()}) + "+" + std::to_string(view.offset);
    const std::string why =
        fast_ulysses::irregular_strides_reason(c.layout, view.shape, view.strides, c.element_size);
    std::optional<fast_ulysses::Plan> plan;
    try {
      plan = fast_ulysses::make_plan(request, view.strides);
    } catch (const fast_ulysses::PlanError&) {
      if (why.empty()) return ::testing::AssertionFailure() << "rank " << r << ": refused";
      ++counts.rejected;
      continue;
    }
    if (!why.empty()) return ::testing::AssertionFailure() << "rank " << r << ": " << why;
    if (auto ok = strided_copies_ok(*plan); !ok) return ok << " (rank " << r << ")";
    view.parent_elements = parent_elements(view);
    if (view.parent_elements > 0) views[r] = view;  // too large to hold: arithmetic alone
  }
  ++counts.accepted;
  ++counts.materialised;
  return strided_matches_reference(c, views, seed);
}

// The rule on any shape, strides and element size: an answer, never a crash or an overflow.
void rule_on_edges(Draw& d, std::string& input) {
  fast_ulysses::Shape4 shape;
  fast_ulysses::Strides strides;
  for (auto& n : shape) n = d.one_in(2) ? d.below(5) : d.any();
  for (auto& n : strides) n = d.any();
  const auto layout = static_cast<Layout>(d.below(3));
  const int64_t es = d.one_in(2) ? int64_t{1} << d.below(3) : d.any();
  input = std::string("irregular_strides_reason(") + fast_ulysses::layout_name(layout) + ", " +
          join({shape.begin(), shape.end()}) + ", " + join({strides.begin(), strides.end()}) +
          ", " + std::to_string(es) + ")";
  (void)fast_ulysses::irregular_strides_reason(layout, shape, strides, es);
}

int run(uint64_t seed, int64_t first, int64_t count) {
  Counts counts;
  const auto start = std::chrono::steady_clock::now();
  static const char* kinds[] = {"small", "small",      "mutated", "raw",
                                "huge",  "from_shape", "strided", "stride_rule"};
  for (int64_t i = first; i < first + count; ++i) {
    Draw d{std::mt19937_64(mix(seed, static_cast<uint64_t>(i)))};
    const int kind = static_cast<int>(d.below(8));
    std::string input;
    ::testing::AssertionResult result = ::testing::AssertionSuccess();
    try {
      if (kind == 7) {
        rule_on_edges(d, input);
      } else if (kind == 6) {
        result = check_strided(d, d.rng(), counts, input);
      } else if (kind == 5) {
        result = check_from_shape(d, d.rng(), counts, input);
      } else {
        const PlanRequest r = kind <= 1   ? small_valid(d)
                              : kind == 2 ? mutated(d)
                              : kind == 3 ? raw(d)
                                          : huge(d);
        input = show(r);
        result = check_request(r, d.rng(), counts);
      }
    } catch (const std::exception& error) {
      result = ::testing::AssertionFailure()
               << "threw " << typeid(error).name() << ": " << error.what();
    } catch (...) {
      result = ::testing::AssertionFailure() << "threw something that is not a std::exception";
    }
    if (!result) {
      std::printf(
          "FAILED input %lld (%s): %s\n  %s\n  replay: fu_plan_fuzz --seed %llu --only %lld\n",
          static_cast<long long>(i), kinds[kind], input.c_str(), result.message(),
          static_cast<unsigned long long>(seed), static_cast<long long>(i));
      return 1;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "fuzz: %lld inputs, seed %llu, %.1f s: %lld accepted (%lld executed on buffers, "
      "%lld checked by arithmetic), %lld rejected with PlanError; no failure\n",
      static_cast<long long>(count), static_cast<unsigned long long>(seed), seconds,
      static_cast<long long>(counts.accepted), static_cast<long long>(counts.materialised),
      static_cast<long long>(counts.arithmetic), static_cast<long long>(counts.rejected));
  return 0;
}

}  // namespace
}  // namespace fu_test

int main(int argc, char** argv) {
  uint64_t seed = 20261203;
  long long count = 1'000'000, only = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 < argc && arg == "--seed")
      seed = std::strtoull(argv[++i], nullptr, 10);
    else if (i + 1 < argc && arg == "--inputs")
      count = std::atoll(argv[++i]);
    else if (i + 1 < argc && arg == "--only")
      only = std::atoll(argv[++i]);
    else {
      std::fprintf(stderr, "usage: fu_plan_fuzz [--inputs N] [--seed S] [--only I]\n");
      return 2;
    }
  }
  if (count < 1) {
    std::fprintf(stderr, "--inputs %lld: must be >= 1\n", count);
    return 2;
  }
  std::printf("fuzz: seed %llu (replay one input: --seed %llu --only I)\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
  std::fflush(stdout);
  return only >= 0 ? fu_test::run(seed, only, 1) : fu_test::run(seed, 0, count);
}
