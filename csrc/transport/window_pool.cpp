#include "transport/window_pool.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>

#include "ops/plan_errors.h"
#include "plan/tag_rules.h"
#include "transport/cuda_check.h"
#include "transport/handshake.h"

namespace fast_ulysses::transport {
namespace {

constexpr int64_t align_up(int64_t bytes, int64_t alignment) {
  return (bytes + alignment - 1) / alignment * alignment;
}

// The signal header, rounded so that every window starts on kAlignment.
constexpr int64_t kHeaderReserved = align_up(Handshake::kHeaderBytes, WindowPool::kAlignment);

}  // namespace

WindowPool::WindowPool(std::string group_name, c10::Device device, int64_t initial_bytes)
    : group_name_(std::move(group_name)), device_(device) {
  TORCH_CHECK_VALUE(initial_bytes >= 0, "initial_pool_bytes=", initial_bytes, ": must be >= 0");
  add_segment(kHeaderReserved + align_up(initial_bytes, kAlignment),
              /*with_header=*/true);
  rank_ = segments_[0].handle->get_rank();
  world_size_ = segments_[0].handle->get_world_size();
}

void WindowPool::add_segment(int64_t bytes, bool with_header) {
  c10::cuda::CUDAGuard guard(device_);
  Segment segment;
  segment.bytes = align_up(bytes, kAlignment);
  segment.storage = c10d::symmetric_memory::empty_strided_p2p({segment.bytes}, {1}, at::kByte,
                                                              device_, group_name_, std::nullopt);
  if (with_header) {
    // Written and finished before the rendezvous: no peer can address it before that returns.
    std::vector<uint32_t> words = Handshake::initial_header();
    FU_CUDA_CHECK(cudaMemcpy(segment.storage.data_ptr(), words.data(), Handshake::kHeaderBytes,
                             cudaMemcpyHostToDevice));
    segment.used = kHeaderReserved;
  }
  segment.handle = c10d::symmetric_memory::rendezvous(segment.storage, group_name_);
  const auto bases = segment.handle->get_buffer_ptrs();
  const int me = segment.handle->get_rank();
  // The handle's pointers address the allocation; our tensor may start inside it.
  const int64_t shift =
      static_cast<char*>(segment.storage.data_ptr()) - static_cast<char*>(bases[me]);
  for (void* base : bases) segment.bases.push_back(static_cast<char*>(base) + shift);
  segments_.push_back(std::move(segment));
}

std::vector<char*> WindowPool::headers() const {
  return segments_.front().bases;
}

Window WindowPool::carve(Segment& segment, int index, int64_t bytes) const {
  Window window;
  window.segment = index;
  window.offset = segment.used;
  window.bytes = bytes;
  for (char* base : segment.bases) window.peers.push_back(base + window.offset);
  window.local = window.peers[rank_];
  segment.used += align_up(std::max<int64_t>(bytes, 1), kAlignment);
  auto* keep = new at::Tensor(segment.storage);  // the segment outlives every view of the window
  c10::DataPtr data(
      window.local, keep, [](void* held) { delete static_cast<at::Tensor*>(held); }, device_);
  window.storage = c10::Storage(c10::Storage::use_byte_size_t(), static_cast<size_t>(bytes),
                                std::move(data), /*allocator=*/nullptr, /*resizable=*/false);
  return window;
}

const Window* WindowPool::find(int slot, int64_t bytes) const {
  auto found = windows_.find(slot);
  return found != windows_.end() && found->second.bytes >= bytes ? &found->second : nullptr;
}

const Window& WindowPool::acquire(int slot, const std::string& tag, int64_t bytes) {
  if (const Window* window = find(slot, bytes)) return *window;
  auto found = windows_.find(slot);
  // The rule (sealed or not, how much a tag that outgrows its window gets) is the plan
  // library's, which the fallback applies too; old windows are never reused.
  bytes = translate_plan_errors([&] {
    return window_for_call(tag, bytes, found == windows_.end() ? -1 : found->second.bytes, sealed_);
  });
  Segment* segment = &segments_.back();
  if (segment->bytes - segment->used < bytes) {
    add_segment(std::max(bytes, segment->bytes), /*with_header=*/false);
    segment = &segments_.back();
  }
  windows_[slot] = carve(*segment, segments() - 1, bytes);
  return windows_[slot];
}

void WindowPool::reserve(const std::vector<std::pair<int, int64_t>>& slots) {
  int64_t needed = 0;
  for (const auto& [slot, bytes] : slots) {
    auto found = windows_.find(slot);
    if (found == windows_.end() || found->second.bytes < bytes)
      needed += align_up(std::max<int64_t>(bytes, 1), kAlignment);
  }
  if (segments_.back().bytes - segments_.back().used < needed)
    add_segment(needed, /*with_header=*/false);
  Segment& segment = segments_.back();
  for (const auto& [slot, bytes] : slots) {
    auto found = windows_.find(slot);
    if (found == windows_.end() || found->second.bytes < bytes)
      windows_[slot] = carve(segment, segments() - 1, bytes);
  }
  sealed_ = true;
}

at::Tensor WindowPool::local_tensor(const Window& window, c10::IntArrayRef shape,
                                    at::ScalarType dtype) const {
  const at::Tensor& base = segments_[window.segment].storage;
  int64_t bytes = static_cast<int64_t>(c10::elementSize(dtype));
  for (const int64_t extent : shape) bytes *= extent;
  TORCH_CHECK(bytes <= window.bytes, "window of ", window.bytes, " bytes cannot hold ", shape,
              " of ", dtype);
  at::Tensor view = at::detail::make_tensor<c10::TensorImpl>(
      c10::Storage(window.storage), base.key_set(), c10::scalarTypeToTypeMeta(dtype));
  view.unsafeGetTensorImpl()->set_sizes_contiguous(shape);
  return view;
}

int64_t WindowPool::capacity() const {
  int64_t total = 0;
  for (const auto& s : segments_) total += s.bytes;
  return total - kHeaderReserved;
}

int64_t WindowPool::used() const {
  int64_t total = 0;
  for (const auto& s : segments_) total += s.used;
  return total - kHeaderReserved;
}

}  // namespace fast_ulysses::transport
