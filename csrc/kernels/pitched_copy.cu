#include "kernels/pitched_copy.h"

#include <algorithm>
#include <cstdint>

namespace fast_ulysses::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
// Rows in flight per warp: its loads are all issued before its stores.
constexpr int kRowsPerWarp = 4;

struct alignas(16) Bytes16 {
  uint4 v;
};

// Row r's slice and row within it; 32-bit division where the rows fit (they do for any real
// tensor: rows are b * tokens).
__device__ __forceinline__ void split_row(int64_t row, int64_t height, int64_t& z, int64_t& y) {
  if (row <= UINT32_MAX && height <= UINT32_MAX) {
    const uint32_t r = static_cast<uint32_t>(row), h = static_cast<uint32_t>(height);
    z = r / h;
    y = r - static_cast<uint32_t>(z) * h;
  } else {
    z = row / height;
    y = row % height;
  }
}

// Sizes in elements of E (the widest of 16, 8, 4, 2, 1 bytes that divides every width, pitch
// and address). A warp copies kRowsPerWarp rows at a time, its lanes striding along each row.
template <typename E>
__global__ void __launch_bounds__(kThreads)
    pitched_copy_kernel(const E* __restrict__ src, E* __restrict__ dst, int64_t width,
                        int64_t height, int64_t rows, int64_t src_pitch, int64_t dst_pitch,
                        int64_t src_slice, int64_t dst_slice) {
  const int lane = threadIdx.x % 32;
  const int64_t first_warp = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * kWarps;
  for (int64_t row0 = first_warp * kRowsPerWarp; row0 < rows; row0 += warps * kRowsPerWarp) {
    const E* from[kRowsPerWarp];
    E* to[kRowsPerWarp];
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      int64_t z = 0, y = 0;
      split_row(min(row0 + r, rows - 1), height, z, y);
      from[r] = src + z * src_slice + y * src_pitch;
      to[r] = dst + z * dst_slice + y * dst_pitch;
    }
    const int64_t left = rows - row0;
    const int valid = left < kRowsPerWarp ? static_cast<int>(left) : kRowsPerWarp;
    for (int64_t col = lane; col < width; col += 32) {
      E v[kRowsPerWarp];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        if (r < valid) v[r] = from[r][col];
#pragma unroll
      for (int r = 0; r < kRowsPerWarp; ++r)
        if (r < valid) to[r][col] = v[r];
    }
  }
}

template <typename E>
cudaError_t launch(const CopyDescriptor& c, const void* src, void* dst, int64_t es,
                   cudaStream_t stream) {
  const int64_t rows = c.height * c.depth;
  const int64_t warps_needed = (rows + kRowsPerWarp - 1) / kRowsPerWarp;
  // Enough blocks to fill the device several times over; the grid-stride loop does the rest.
  const int64_t blocks = std::min<int64_t>((warps_needed + kWarps - 1) / kWarps, 65536);
  pitched_copy_kernel<E><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<const E*>(src), static_cast<E*>(dst), c.width / es, c.height, rows,
      c.src_pitch / es, c.dst_pitch / es, c.src_slice_pitch / es, c.dst_slice_pitch / es);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_pitched_copy(const CopyDescriptor& c, const void* src_base, void* dst_base,
                                cudaStream_t stream) {
  if (c.width <= 0 || c.height <= 0 || c.depth <= 0) return cudaSuccess;
  const void* src = static_cast<const char*>(src_base) + c.src_offset;
  void* dst = static_cast<char*>(dst_base) + c.dst_offset;
  const uint64_t all = static_cast<uint64_t>(c.width | c.src_pitch | c.dst_pitch |
                                             c.src_slice_pitch | c.dst_slice_pitch) |
                       reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst);
  if (all % 16 == 0) return launch<Bytes16>(c, src, dst, 16, stream);
  if (all % 8 == 0) return launch<uint64_t>(c, src, dst, 8, stream);
  if (all % 4 == 0) return launch<uint32_t>(c, src, dst, 4, stream);
  if (all % 2 == 0) return launch<uint16_t>(c, src, dst, 2, stream);
  return launch<uint8_t>(c, src, dst, 1, stream);
}

}  // namespace fast_ulysses::kernels
