// A rank's receive windows, in torch's symmetric memory.
//
// The pool is a list of segments, each one allocation made with
// c10d::symmetric_memory::empty_strided_p2p and mapped by every peer through rendezvous() (both
// collective). Windows are carved from the segments by a bump allocator, one per tag slot. Every
// decision here depends only on the sequence of calls, which the contract makes identical on
// every rank, so all ranks carve the same offsets and grow at the same call.
// Segment 0 starts with the handshake's signal header, initialised before its rendezvous.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <torch/csrc/distributed/c10d/symm_mem/SymmetricMemory.hpp>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace fast_ulysses::transport {

struct Window {
  int segment = -1;
  int64_t offset = 0;  // inside the segment, the same on every rank
  int64_t bytes = 0;
  char* local = nullptr;     // my window
  std::vector<char*> peers;  // every rank's window, as I address it (peers[rank] == local)
  // My window as a storage of its own (keeping its segment alive): c10d keys a result's wait
  // by its storage, so each borrowed result must have its own, or the first use of one would
  // consume every other window's wait, on whatever stream it ran.
  c10::Storage storage;
};

class WindowPool {
 public:
  static constexpr int64_t kAlignment = 4096;

  WindowPool(std::string group_name, c10::Device device, int64_t initial_bytes);

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  // Each rank's signal header, as I address it.
  std::vector<char*> headers() const;

  // The window of `slot`, at least `bytes` long: the current one if large enough, else a new
  // one (at least 1.5x the old) carved from the pool, which grows by one segment (a
  // collective) unless sealed. Windows start on kAlignment.
  const Window& acquire(int slot, const std::string& tag, int64_t bytes);
  // The current window of `slot` if it holds at least `bytes`, else null. Never allocates.
  const Window* find(int slot, int64_t bytes) const;
  // Gives each listed slot a window of at least its bytes, growing the pool at most once, then
  // seals it: afterwards acquire() raises for a slot without a window or one too small.
  void reserve(const std::vector<std::pair<int, int64_t>>& slots);
  bool sealed() const { return sealed_; }

  // A contiguous tensor of `shape` and `dtype` at the start of my window, over the window's
  // own storage. Built without the dispatcher (a TensorImpl over that Storage), as this is on
  // every borrowed call's path; the window must hold it.
  at::Tensor local_tensor(const Window& window, c10::IntArrayRef shape, at::ScalarType dtype) const;

  int64_t capacity() const;
  int64_t used() const;
  int segments() const { return static_cast<int>(segments_.size()); }

 private:
  struct Segment {
    at::Tensor storage;
    c10::intrusive_ptr<c10d::symmetric_memory::SymmetricMemory> handle;
    std::vector<char*> bases;  // every rank's segment start, as I address it
    int64_t bytes = 0;
    int64_t used = 0;
  };

  void add_segment(int64_t bytes, bool with_header);  // collective
  Window carve(Segment& segment, int index, int64_t bytes) const;

  std::string group_name_;
  c10::Device device_;
  int rank_ = 0;
  int world_size_ = 1;
  bool sealed_ = false;
  std::vector<Segment> segments_;
  std::unordered_map<int, Window> windows_;
};

}  // namespace fast_ulysses::transport
