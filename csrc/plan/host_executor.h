// Runs copy descriptors with memcpy on host memory: the CPU twin of the copy-engine transport.
// Used by the C++ tests and by fast_ulysses.simulate(), so both exercise the exact addressing
// the GPU path issues.
#pragma once

#include <cstddef>
#include <cstdint>

#include "plan/plan.h"

namespace fast_ulysses {

// Throws PlanError if the descriptor would read past src_bytes or write past dst_bytes.
void check_descriptor_bounds(const CopyDescriptor& copy, int64_t src_bytes, int64_t dst_bytes);

// Bounds-checked; executes coalesced(copy), the form the GPU transport issues.
void execute_on_host(const CopyDescriptor& copy, const std::byte* src, int64_t src_bytes,
                     std::byte* dst, int64_t dst_bytes);

}  // namespace fast_ulysses
