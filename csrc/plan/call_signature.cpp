#include "plan/call_signature.h"

namespace fast_ulysses {
namespace {

constexpr uint64_t kOffsetBasis = 14695981039346656037ull;
constexpr uint64_t kPrime = 1099511628211ull;

uint64_t mix(uint64_t hash, uint64_t value) {
  for (int byte = 0; byte < 8; ++byte) {
    hash ^= (value >> (8 * byte)) & 0xff;
    hash *= kPrime;
  }
  return hash;
}

}  // namespace

uint64_t request_hash(const PlanRequest& request) {
  uint64_t hash = kOffsetBasis;
  for (int64_t value : {int64_t{request.world_size}, static_cast<int64_t>(request.mode),
                        static_cast<int64_t>(request.layout), request.batch, request.head_dim,
                        request.element_size})
    hash = mix(hash, static_cast<uint64_t>(value));
  for (const auto* splits : {&request.seq_splits, &request.head_splits}) {
    hash = mix(hash, splits->size());
    for (int64_t value : *splits) hash = mix(hash, static_cast<uint64_t>(value));
  }
  return hash;
}

uint64_t tag_hash(const std::string& tag) {
  uint64_t hash = mix(kOffsetBasis, tag.size());
  for (unsigned char c : tag) {
    hash ^= c;
    hash *= kPrime;
  }
  return hash;
}

uint32_t call_signature(uint64_t request_hash, uint64_t tag_hash) {
  const uint64_t hash = mix(request_hash, tag_hash);
  const uint32_t folded = static_cast<uint32_t>(hash ^ (hash >> 32));
  return folded | 0x80000000u;
}

}  // namespace fast_ulysses
