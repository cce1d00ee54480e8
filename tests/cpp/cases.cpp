#include "cases.h"

namespace fu_test {
namespace {

using fast_ulysses::Layout;
using fast_ulysses::Mode;

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::vector<int64_t> random_splits(std::mt19937_64& rng, int world_size) {
  std::uniform_int_distribution<int64_t> entry(0, 5);
  std::vector<int64_t> splits(world_size);
  int64_t sum = 0;
  for (auto& s : splits) sum += (s = entry(rng));
  if (sum == 0) splits[rng() % world_size] = 1;
  return splits;
}

}  // namespace

std::vector<std::vector<int64_t>> split_patterns(int world_size) {
  std::vector<int64_t> even(world_size, 2), uneven(world_size), zeros(world_size),
      last(world_size, 0);
  for (int i = 0; i < world_size; ++i) {
    uneven[i] = i % 3 + 1;
    zeros[i] = i % 2 == 1 ? 0 : i + 1;
  }
  last[world_size - 1] = 3;
  return {even, uneven, zeros, last};
}

std::vector<Case> exhaustive_cases(int world_size, Mode mode, Layout layout) {
  std::vector<Case> cases;
  const auto patterns = split_patterns(world_size);
  for (const auto& seq : patterns)
    for (const auto& heads : patterns)
      for (int64_t es : {1, 2, 4})
        for (int64_t d : {int64_t{1}, int64_t{3}, 48 / es})  // rows of es, 3 * es and 48 bytes
          for (int64_t batch : {1, 2, 3})
            cases.push_back(Case{mode, layout, batch, d, es, seq, heads});
  return cases;
}

Case random_case(std::mt19937_64& rng) {
  const int P = static_cast<int>(rng() % fast_ulysses::kMaxWorldSize) + 1;
  const int64_t sizes[] = {1, 2, 4};
  Case c;
  c.mode = rng() % 2 ? Mode::kHeadToSeq : Mode::kSeqToHead;
  c.layout = static_cast<Layout>(rng() % 3);
  c.batch = static_cast<int64_t>(rng() % 3) + 1;
  c.element_size = sizes[rng() % 3];
  // Half the rows a multiple of 16 bytes, half any width (d in 1..7).
  c.head_dim = rng() % 2 ? (16 / c.element_size) * (static_cast<int64_t>(rng() % 3) + 1)
                         : static_cast<int64_t>(rng() % 7) + 1;
  c.seq_splits = random_splits(rng, P);
  c.head_splits = random_splits(rng, P);
  return c;
}

RankBuffers make_inputs(const Case& c, uint64_t seed) {
  RankBuffers inputs(c.world_size());
  for (int r = 0; r < c.world_size(); ++r) {
    inputs[r].resize(reference_input_bytes(c, r));
    const uint64_t base = splitmix64(seed * 1315423911ULL + static_cast<uint64_t>(r));
    for (size_t k = 0; k < inputs[r].size(); ++k)
      inputs[r][k] = static_cast<std::byte>(splitmix64(base + k) % 255 + 1);
  }
  return inputs;
}

Case inverse(const Case& c) {
  Case back = c;
  back.mode = c.mode == Mode::kSeqToHead ? Mode::kHeadToSeq : Mode::kSeqToHead;
  return back;
}

}  // namespace fu_test
