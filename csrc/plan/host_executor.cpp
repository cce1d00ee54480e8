#include "plan/host_executor.h"

#include <cstring>
#include <sstream>

namespace fast_ulysses {

void check_descriptor_bounds(const CopyDescriptor& copy, int64_t src_bytes, int64_t dst_bytes) {
  const bool negative = copy.width < 0 || copy.height < 0 || copy.depth < 0 ||
                        copy.src_offset < 0 || copy.dst_offset < 0 || copy.src_pitch < 0 ||
                        copy.dst_pitch < 0 || copy.src_slice_pitch < 0 || copy.dst_slice_pitch < 0;
  const int64_t src_end = copy.src_extent();
  const int64_t dst_end = copy.dst_extent();
  if (negative || src_end > src_bytes || dst_end > dst_bytes) {
    std::ostringstream message;
    message << "copy descriptor for peer " << copy.peer << " (width " << copy.width << ", height "
            << copy.height << ", depth " << copy.depth << ") reaches source byte " << src_end
            << " of " << src_bytes << " and destination byte " << dst_end << " of " << dst_bytes
            << ": it must stay inside both buffers";
    throw PlanError(message.str());
  }
}

void execute_on_host(const CopyDescriptor& descriptor, const std::byte* src, int64_t src_bytes,
                     std::byte* dst, int64_t dst_bytes) {
  check_descriptor_bounds(descriptor, src_bytes, dst_bytes);
  if (descriptor.bytes() == 0) return;
  // The form the GPU transport issues.
  const CopyDescriptor copy = coalesced(descriptor);
  const bool dense = copy.height == 1;
  for (int64_t z = 0; z < copy.depth; ++z) {
    const std::byte* s = src + copy.src_offset + z * copy.src_slice_pitch;
    std::byte* d = dst + copy.dst_offset + z * copy.dst_slice_pitch;
    if (dense) {
      std::memcpy(d, s, static_cast<size_t>(copy.width * copy.height));
      continue;
    }
    for (int64_t y = 0; y < copy.height; ++y)
      std::memcpy(d + y * copy.dst_pitch, s + y * copy.src_pitch, static_cast<size_t>(copy.width));
  }
}

}  // namespace fast_ulysses
