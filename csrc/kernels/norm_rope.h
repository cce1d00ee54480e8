// The fused QK RMSNorm + RoPE scatter: one pass over this rank's q or k in mode-0 input layout
// that normalises and rotates each token's row in float32 and stores each head's result
// straight into the window of the rank that owns the head after the mode-0 all-to-all. The
// math (the only definition the fallback and the tests share with it):
//   RMSNorm, norm "all_heads": y = x * rsqrt(mean(x^2 over the token's N*d values) + eps) * w,
//     w of N*d values; "per_head": the mean is over the head's d values, w of d values.
//   RoPE with c = cos[s][i], t = sin[s][i] (this rank's row s, pair i < d/2) on the pair
//   (a, b) = (y[2i], y[2i+1]) ("interleaved") or (y[i], y[i + d/2]) ("half"):
//     a' = a*c - b*t, b' = a*t + b*c; the result is rounded to x's dtype once, at the end.
// Plain C++ (no torch, no CUDA headers: the CPU module checks these arguments too); the launch
// is declared in norm_rope_launch.h.
#pragma once

#include <cstdint>

namespace fast_ulysses::kernels {

constexpr int kMaxPeers = 8;

enum class ElementType { kBFloat16, kFloat16, kFloat32 };

struct NormRopeArgs {
  const void* x = nullptr;  // (b, s_local, N, d) for bshd, (s_local, b, N, d) for sbhd
  ElementType type = ElementType::kBFloat16;
  const float* weight = nullptr;  // N*d values (all_heads) or d (per_head)
  const float* cos = nullptr;     // (s_local, d/2)
  const float* sin = nullptr;
  float eps = 1e-6f;
  bool per_head = false;
  bool half_style = false;  // rotate-half pairs; else interleaved
  bool sbhd = false;
  int64_t batch = 1;
  int64_t s_local = 0;
  int64_t heads = 0;       // N
  int64_t head_dim = 0;    // d, even
  int64_t seq_total = 0;   // S
  int64_t seq_offset = 0;  // this rank's first row in S
  int peers = 1;
  int64_t head_start[kMaxPeers + 1] = {};  // rank j owns heads [head_start[j], head_start[j+1])
  char* dst[kMaxPeers] = {};  // rank j's receive window (its mode-0 output, from byte 0)
};

}  // namespace fast_ulysses::kernels
