#include "checks.h"

#include <algorithm>
#include <random>
#include <sstream>
#include <string>

#include "cases.h"
#include "plan/host_executor.h"

namespace fu_test {
namespace {

using fast_ulysses::CopyDescriptor;
using fast_ulysses::Plan;
using ::testing::AssertionFailure;
using ::testing::AssertionResult;
using ::testing::AssertionSuccess;
using Wide = __int128;  // the checks' own arithmetic never overflows, whatever the plan did

int hex(std::byte b) {
  return static_cast<int>(b);
}

// Copies arriving at each rank j, summed over senders: plans[r].copies[j].
AssertionResult incoming_bytes_agree(const std::vector<fast_ulysses::Plan>& plans) {
  for (size_t j = 0; j < plans.size(); ++j) {
    int64_t incoming = 0;
    for (const auto& plan : plans) incoming += plan.copies[j].bytes();
    if (incoming != plans[j].output_bytes)
      return AssertionFailure() << "rank " << j << " receives " << incoming
                                << " bytes but its output is " << plans[j].output_bytes;
  }
  return AssertionSuccess();
}

// One past the last byte a side of `c` touches, in 128 bits (0 when it moves nothing).
Wide extent(const CopyDescriptor& c, bool dst) {
  if (c.width <= 0 || c.height <= 0 || c.depth <= 0) return 0;
  const Wide offset = dst ? c.dst_offset : c.src_offset;
  const Wide pitch = dst ? c.dst_pitch : c.src_pitch;
  const Wide slice = dst ? c.dst_slice_pitch : c.src_slice_pitch;
  return offset + (Wide(c.depth) - 1) * slice + (Wide(c.height) - 1) * pitch + c.width;
}

bool has_negative_field(const CopyDescriptor& c) {
  return c.width < 0 || c.height < 0 || c.depth < 0 || c.src_offset < 0 || c.dst_offset < 0 ||
         c.src_pitch < 0 || c.dst_pitch < 0 || c.src_slice_pitch < 0 || c.dst_slice_pitch < 0;
}

std::string show(const CopyDescriptor& c) {
  std::ostringstream out;
  out << "{peer " << c.peer << ", src_offset " << c.src_offset << ", dst_offset " << c.dst_offset
      << ", width " << c.width << ", height " << c.height << ", depth " << c.depth << ", pitches "
      << c.src_pitch << "/" << c.dst_pitch << ", slice pitches " << c.src_slice_pitch << "/"
      << c.dst_slice_pitch << "}";
  return out.str();
}

AssertionResult inside(const CopyDescriptor& c, int64_t src_bytes, int64_t dst_bytes) {
  if (has_negative_field(c)) return AssertionFailure() << "negative field in " << show(c);
  if (extent(c, false) > src_bytes || extent(c, true) > dst_bytes)
    return AssertionFailure() << show(c) << " reaches past its source (" << src_bytes
                              << " bytes) or destination (" << dst_bytes << " bytes)";
  return AssertionSuccess();
}

// The destination sides of `copies` write every byte of [0, total) exactly once. Proved without
// touching memory: the copies share a slice structure (the same depth and slice pitch, total =
// depth * slice pitch), and within one slice either every copy is one contiguous run and the runs
// tile the slice, or every copy is rows of the same pitch and count whose first rows tile one
// pitch. Shapes outside both forms are enumerated row by row when small, else reported.
AssertionResult tiles_exactly_once(std::vector<CopyDescriptor> copies, int64_t total) {
  copies.erase(std::remove_if(copies.begin(), copies.end(),
                              [](const CopyDescriptor& c) { return c.bytes() == 0; }),
               copies.end());
  if (copies.empty())
    return total == 0 ? AssertionSuccess()
                      : AssertionFailure() << "no copy writes the " << total << " output bytes";
  const int64_t depth = copies[0].depth;
  const Wide slice = depth == 1 ? Wide(total) : Wide(copies[0].dst_slice_pitch);
  for (const auto& c : copies)
    if (c.depth != depth || (depth > 1 && c.dst_slice_pitch != slice))
      return AssertionFailure() << "copies of different slice structure: " << show(c) << " vs "
                                << show(copies[0]);
  if (Wide(depth) * slice != total)
    return AssertionFailure() << "depth " << depth << " x slice pitch " << int64_t(slice)
                              << " != " << total << " output bytes";
  struct Run {
    Wide begin, end;
  };
  std::vector<Run> runs;  // first-slice runs when every copy is contiguous or the first rows
  const auto dense = [](const CopyDescriptor& c) {
    return c.height == 1 || c.dst_pitch == c.width;
  };
  for (const auto& c : copies)
    if (Wide(c.dst_offset) + (Wide(c.height) - 1) * c.dst_pitch + c.width > slice)
      return AssertionFailure() << show(c) << " crosses its slice of " << int64_t(slice);
  const bool all_dense = std::all_of(copies.begin(), copies.end(), dense);
  const bool same_rows = std::all_of(copies.begin(), copies.end(), [&](const CopyDescriptor& c) {
    return c.height == copies[0].height && c.dst_pitch == copies[0].dst_pitch &&
           Wide(c.height) * c.dst_pitch == slice;
  });
  Wide span = slice;
  if (all_dense) {
    for (const auto& c : copies)
      runs.push_back({c.dst_offset, Wide(c.dst_offset) + Wide(c.height) * c.width});
  } else if (same_rows) {
    span = copies[0].dst_pitch;  // every row of the slice repeats the first one's pattern
    for (const auto& c : copies) runs.push_back({c.dst_offset, Wide(c.dst_offset) + c.width});
  } else {
    Wide rows = 0;
    for (const auto& c : copies) rows += c.height;
    if (rows > 2'000'000)
      return AssertionFailure() << "cannot check " << copies.size() << " copies of "
                                << int64_t(rows) << " rows arithmetically: " << show(copies[0]);
    for (const auto& c : copies)
      for (int64_t y = 0; y < c.height; ++y)
        runs.push_back({Wide(c.dst_offset) + Wide(y) * c.dst_pitch,
                        Wide(c.dst_offset) + Wide(y) * c.dst_pitch + c.width});
  }
  std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.begin < b.begin; });
  Wide next = 0;
  for (const auto& run : runs) {
    if (run.begin != next)
      return AssertionFailure() << (run.begin < next ? "bytes written twice"
                                                     : "bytes never written")
                                << " at byte " << int64_t(std::min(run.begin, next)) << " of a "
                                << int64_t(span) << "-byte tile";
    next = run.end;
  }
  if (next != span)
    return AssertionFailure() << "bytes never written from byte " << int64_t(next) << " of a "
                              << int64_t(span) << "-byte tile";
  return AssertionSuccess();
}

// The source byte of the copy in `copies` that writes destination byte `pos`; sets `writers` to
// how many copies write it.
int64_t writer_of(const std::vector<CopyDescriptor>& copies, int64_t pos, int& writers,
                  int& sender) {
  writers = 0;
  int64_t source = -1;
  for (size_t i = 0; i < copies.size(); ++i) {
    const CopyDescriptor& c = copies[i];
    if (c.bytes() == 0 || pos < c.dst_offset) continue;
    Wide rel = Wide(pos) - c.dst_offset;
    const Wide z = c.depth > 1 ? rel / c.dst_slice_pitch : 0;
    rel -= z * (c.depth > 1 ? c.dst_slice_pitch : 0);
    const Wide y = c.height > 1 ? rel / c.dst_pitch : 0;
    const Wide x = rel - y * (c.height > 1 ? c.dst_pitch : 0);
    if (z >= c.depth || y >= c.height || x >= c.width) continue;
    ++writers;
    sender = static_cast<int>(i);
    source = static_cast<int64_t>(c.src_offset + z * c.src_slice_pitch + y * c.src_pitch + x);
  }
  return source;
}

}  // namespace

AssertionResult same_bytes(const RankBuffers& actual, const RankBuffers& expected) {
  if (actual.size() != expected.size())
    return AssertionFailure() << actual.size() << " buffers, expected " << expected.size();
  for (size_t r = 0; r < actual.size(); ++r) {
    if (actual[r].size() != expected[r].size())
      return AssertionFailure() << "rank " << r << " has " << actual[r].size()
                                << " bytes, expected " << expected[r].size();
    const auto diff = std::mismatch(actual[r].begin(), actual[r].end(), expected[r].begin());
    if (diff.first != actual[r].end())
      return AssertionFailure() << "rank " << r << " byte " << (diff.first - actual[r].begin())
                                << " of " << actual[r].size() << ": got " << hex(*diff.first)
                                << ", expected " << hex(*diff.second);
  }
  return AssertionSuccess();
}

AssertionResult plan_sizes_agree(const Case& c, const std::vector<fast_ulysses::Plan>& plans) {
  int64_t largest = 0;
  for (int r = 0; r < c.world_size(); ++r)
    largest = std::max(largest, reference_output_bytes(c, r));
  for (int r = 0; r < c.world_size(); ++r) {
    const auto& plan = plans[r];
    if (plan.input_bytes != reference_input_bytes(c, r) ||
        plan.output_bytes != reference_output_bytes(c, r))
      return AssertionFailure() << "rank " << r << " plan bytes in/out " << plan.input_bytes << "/"
                                << plan.output_bytes << ", reference "
                                << reference_input_bytes(c, r) << "/"
                                << reference_output_bytes(c, r);
    if (plan.window_bytes != largest)
      return AssertionFailure() << "rank " << r << " window_bytes " << plan.window_bytes
                                << ", largest output " << largest;
    if (static_cast<int>(plan.copies.size()) != c.world_size())
      return AssertionFailure() << "rank " << r << " has " << plan.copies.size() << " copies";
    for (int j = 0; j < c.world_size(); ++j)
      if (plan.copies[j].peer != j)
        return AssertionFailure() << "rank " << r << " copies[" << j << "].peer is "
                                  << plan.copies[j].peer;
  }
  return incoming_bytes_agree(plans);
}

AssertionResult every_output_byte_written(const std::vector<fast_ulysses::Plan>& plans,
                                          const Executed& executed, std::byte sentinel) {
  for (size_t j = 0; j < plans.size(); ++j) {
    const auto& window = executed.windows[j];
    const auto end = window.begin() + plans[j].output_bytes;
    const auto unwritten = std::find(window.begin(), end, sentinel);
    if (unwritten != end)
      return AssertionFailure() << "rank " << j << " output byte " << (unwritten - window.begin())
                                << " was never written";
    const auto touched =
        std::find_if(end, window.end(), [&](std::byte b) { return b != sentinel; });
    if (touched != window.end())
      return AssertionFailure() << "rank " << j << " window byte " << (touched - window.begin())
                                << " past output_bytes " << plans[j].output_bytes << " was written";
  }
  return AssertionSuccess();
}

AssertionResult plan_matches_reference(const Case& c, uint64_t seed) {
  const auto plans = make_plans(c);
  if (auto sizes = plan_sizes_agree(c, plans); !sizes) return sizes;
  const RankBuffers inputs = make_inputs(c, seed);
  const std::byte sentinel{0};
  const Executed executed = execute_plans(plans, inputs, sentinel);
  // Exactly once: every byte is written and (plan_sizes_agree) the copies add up to the output.
  if (auto coverage = every_output_byte_written(plans, executed, sentinel); !coverage)
    return coverage;
  return same_bytes(executed.outputs, reference_all_to_all(c, inputs));
}

AssertionResult round_trips(const Case& c, uint64_t seed) {
  const RankBuffers inputs = make_inputs(c, seed);
  const RankBuffers there = run_plans(c, inputs);
  return same_bytes(run_plans(inverse(c), there), inputs);
}

AssertionResult owned_matches_reference(const Case& c, uint64_t seed) {
  const RankBuffers inputs = make_inputs(c, seed);
  const auto plans = make_plans(c);
  const Executed executed = execute_plans(plans, inputs, std::byte{0});
  const RankBuffers expected = reference_all_to_all(c, inputs);
  for (int r = 0; r < c.world_size(); ++r) {
    const Plan& plan = plans[r];
    if (plan.collect.size() > 2)
      return AssertionFailure() << "rank " << r << ": " << plan.collect.size()
                                << " collect copies, at most 2";
    int64_t collected = 0;
    for (const auto& copy : plan.collect) collected += copy.bytes();
    if (collected + plan.copies[r].bytes() != plan.output_bytes)
      return AssertionFailure() << "rank " << r << ": collect moves " << collected
                                << " bytes + own chunk " << plan.copies[r].bytes() << " != output "
                                << plan.output_bytes;
    // A window whose own-chunk bytes are poisoned: collect must not carry them into the result.
    Bytes window = executed.windows[r];
    fast_ulysses::execute_on_host(plan.copies[r], Bytes(plan.input_bytes, std::byte{0}).data(),
                                  plan.input_bytes, window.data(), plan.window_bytes);
    // The owned result: own chunk from the input, then collect from the window.
    Bytes out(plan.output_bytes, std::byte{0});
    fast_ulysses::execute_on_host(plan.copies[r], inputs[r].data(), plan.input_bytes, out.data(),
                                  plan.output_bytes);
    for (const auto& copy : plan.collect)
      fast_ulysses::execute_on_host(copy, window.data(), plan.window_bytes, out.data(),
                                    plan.output_bytes);
    if (auto same = same_bytes({out}, {expected[r]}); !same)
      return same << " (rank " << r << ": owned result vs reference)";
  }
  return AssertionSuccess();
}

AssertionResult plans_cover_exactly_once(const Case& c, const std::vector<Plan>& plans,
                                         uint64_t seed, int samples) {
  if (auto sizes = plan_sizes_agree(c, plans); !sizes) return sizes;
  const int P = c.world_size();
  std::mt19937_64 rng(seed);
  for (int j = 0; j < P; ++j) {
    const Plan& plan = plans[j];
    std::vector<CopyDescriptor> incoming;
    for (int i = 0; i < P; ++i) {
      const CopyDescriptor& copy = plans[i].copies[j];
      if (auto ok = inside(copy, plans[i].input_bytes, plan.window_bytes); !ok)
        return ok << " (rank " << i << " to rank " << j << ")";
      const CopyDescriptor merged = fast_ulysses::coalesced(copy);
      if (merged.bytes() != copy.bytes() || extent(merged, false) > extent(copy, false) ||
          extent(merged, true) > extent(copy, true) || has_negative_field(merged))
        return AssertionFailure() << "coalesced " << show(merged) << " is not the copy "
                                  << show(copy);
      incoming.push_back(copy);
    }
    if (auto tiled = tiles_exactly_once(incoming, plan.output_bytes); !tiled)
      return tiled << " (copies arriving at rank " << j << ")";
    std::vector<CopyDescriptor> owned = plan.collect;
    for (const auto& copy : plan.collect)
      if (auto ok = inside(copy, plan.window_bytes, plan.output_bytes); !ok)
        return ok << " (rank " << j << " collect)";
    owned.push_back(plan.copies[j]);
    if (auto tiled = tiles_exactly_once(owned, plan.output_bytes); !tiled)
      return tiled << " (rank " << j << ": own chunk + collect)";
    if (plan.output_bytes == 0) continue;
    std::uniform_int_distribution<int64_t> byte(0, plan.output_bytes - 1);
    for (int k = 0; k < samples; ++k) {
      const int64_t pos = k == 0 ? 0 : k == 1 ? plan.output_bytes - 1 : byte(rng);
      const SourceByte want = reference_source_of(c, j, pos);
      int writers = 0, sender = -1;
      const int64_t got = writer_of(incoming, pos, writers, sender);
      if (writers != 1 || sender != want.rank || got != want.byte)
        return AssertionFailure() << "rank " << j << " output byte " << pos << ": " << writers
                                  << " writers, from rank " << sender << " byte " << got
                                  << "; the reference reads rank " << want.rank << " byte "
                                  << want.byte;
    }
  }
  return AssertionSuccess();
}

}  // namespace fu_test
