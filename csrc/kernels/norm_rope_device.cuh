// Device code shared by the fused QK RMSNorm + RoPE kernels: norm_rope.cu (the scalar kernel and
// the vector kernel that prefetches into registers) and norm_rope_bulk.cu (the vector kernel
// fed by bulk copies into shared memory). The math is norm_rope.h's; both vector kernels sum in
// the same order, so they give the same bits.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/norm_rope.h"

namespace fast_ulysses::kernels::device {

__device__ __forceinline__ float load(const __nv_bfloat16* p) {
  return __bfloat162float(*p);
}
__device__ __forceinline__ float load(const __half* p) {
  return __half2float(*p);
}
__device__ __forceinline__ float load(const float* p) {
  return *p;
}
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) {
  *p = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store(__half* p, float v) {
  *p = __float2half_rn(v);
}
__device__ __forceinline__ void store(float* p, float v) {
  *p = v;
}

// The rank that owns head h after the mode-0 all-to-all.
__device__ __forceinline__ int owner_of(const NormRopeArgs& a, int64_t h) {
  int j = 0;
  while (j + 1 < a.peers && h >= a.head_start[j + 1]) ++j;
  return j;
}

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The vector path: the same math on 16-byte groups. A unit u of a head is two groups of V =
// 16 / sizeof(T) elements, at uV and d/2 + uV, in both RoPE styles, so that a warp's lanes
// read and write whole consecutive 16-byte groups (adjacent groups for "interleaved" left every
// access half a sector: Nsight Compute counted 50% excess sectors). For "half" the groups are
// partners: pair i of the unit is (a[i], b[i]) with angle uV + i. For "interleaved" each group
// holds V/2 whole pairs of its own: group a's pair p has angle uV/2 + p, group b's d/4 + uV/2 + p
// (unit_angles). A thread holds kUnits units.
template <typename T>
struct Group {
  static constexpr int kV = 16 / sizeof(T);
};

template <typename T>
__device__ __forceinline__ void unpack(const uint4& v, float* f) {
  const T* e = reinterpret_cast<const T*>(&v);
#pragma unroll
  for (int i = 0; i < Group<T>::kV; ++i) f[i] = load(e + i);
}

template <typename T>
__device__ __forceinline__ uint4 pack(const float* f) {
  uint4 v;
  T* e = reinterpret_cast<T*>(&v);
#pragma unroll
  for (int i = 0; i < Group<T>::kV; ++i) store(e + i, f[i]);
  return v;
}

// n floats at p (a multiple of 4, or 2; p aligned to 4n bytes), through the read-only cache
// when kGlobal, else plain loads (shared memory).
template <int n, bool kGlobal>
__device__ __forceinline__ void load_span(const float* p, float* f) {
  if constexpr (n % 4 == 0) {
#pragma unroll
    for (int i = 0; i < n; i += 4) {
      const float4 v = kGlobal ? __ldg(reinterpret_cast<const float4*>(p + i))
                               : *reinterpret_cast<const float4*>(p + i);
      f[i] = v.x, f[i + 1] = v.y, f[i + 2] = v.z, f[i + 3] = v.w;
    }
  } else {
    static_assert(n % 2 == 0, "load_span: n must be even");
#pragma unroll
    for (int i = 0; i < n; i += 2) {
      const float2 v = kGlobal ? __ldg(reinterpret_cast<const float2*>(p + i))
                               : *reinterpret_cast<const float2*>(p + i);
      f[i] = v.x, f[i + 1] = v.y;
    }
  }
}

// The V cosines and V sines of unit `index`, in the order normalise_rotate_store takes them:
// rotate-half: angle index*V + i for pair i; interleaved: group a's V/2 pairs, then group b's
// (the Unit comment above).
template <int V, bool kGlobal>
__device__ __forceinline__ void unit_angles(const float* cos_row, const float* sin_row, int index,
                                            int d, bool half_style, float* ck, float* tk) {
  if (half_style) {
    load_span<V, kGlobal>(cos_row + index * V, ck);
    load_span<V, kGlobal>(sin_row + index * V, tk);
  } else {
    const int a = index * (V / 2), b = d / 4 + index * (V / 2);
    load_span<V / 2, kGlobal>(cos_row + a, ck);
    load_span<V / 2, kGlobal>(cos_row + b, ck + V / 2);
    load_span<V / 2, kGlobal>(sin_row + a, tk);
    load_span<V / 2, kGlobal>(sin_row + b, tk + V / 2);
  }
}

__device__ __forceinline__ void load_floats(const float* p, float* f, int n) {
  for (int i = 0; i < n; i += 4) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p + i));
    f[i] = v.x;
    f[i + 1] = v.y;
    f[i + 2] = v.z;
    f[i + 3] = v.w;
  }
}

// Unit q of a token: its head, its index u in the head, and its two groups' offsets in the
// head's row (the same for both RoPE styles).
template <int V>
struct Unit {
  __device__ __forceinline__ Unit(int q, int per_head_units, int d)
      : head(q / per_head_units),
        index(q % per_head_units),
        off_a(index * V),
        off_b(d / 2 + index * V) {}
  int head, index, off_a, off_b;
};

// The per_head sums go through warp shuffles when a head's units are an aligned power-of-two
// group of at most 32 lanes (they always are aligned: units are numbered q = thread + k *
// blockDim with blockDim a multiple of 32); otherwise through shared memory.
__host__ __device__ constexpr bool shuffle_sums(int per_head_units) {
  return per_head_units > 0 && per_head_units <= 32 && (per_head_units & (per_head_units - 1)) == 0;
}

// Shared memory of the vector kernel, in floats: two buffers of 32 per-warp partials (all_heads)
// and two of one sum per unit (per_head without shuffles). Two of each because a block runs
// several tokens and a fast thread may write token t + 1's sums while a slow one still reads
// token t's; one barrier per token orders the rest.
constexpr int kPartialFloats = 2 * 32;
__host__ __device__ constexpr int vector_shared_floats(int units) {
  return kPartialFloats + 2 * units;
}

// A thread's units (q = threadIdx.x + k * blockDim.x) and where each one's groups go: the same
// for every token, so computed once.
template <typename T, int kUnits>
struct ThreadUnits {
  int head[kUnits], index[kUnits], off_a[kUnits], off_b[kUnits];
  bool valid[kUnits];
  T* out_base[kUnits];
  int64_t out_pitch[kUnits];  // elements between two rows of the destination

  __device__ __forceinline__ ThreadUnits(const NormRopeArgs& a, int units, int per_head_units) {
    constexpr int V = Group<T>::kV;
    const int d = static_cast<int>(a.head_dim);
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      const int q = threadIdx.x + k * blockDim.x;
      valid[k] = q < units;
      const Unit<V> unit(valid[k] ? q : 0, per_head_units, d);
      head[k] = unit.head;
      index[k] = unit.index;
      off_a[k] = unit.off_a;
      off_b[k] = unit.off_b;
      const int j = owner_of(a, unit.head);
      const int64_t owned = a.head_start[j + 1] - a.head_start[j];
      out_base[k] = reinterpret_cast<T*>(a.dst[j]) + (unit.head - a.head_start[j]) * a.head_dim;
      out_pitch[k] = owned * a.head_dim;
    }
  }
};

// Token t's row in x, and its row in every destination window.
__device__ __forceinline__ int64_t input_row(const NormRopeArgs& a, int64_t token) {
  const int64_t b = token / a.s_local;
  const int64_t s = token % a.s_local;
  return a.sbhd ? s * a.batch + b : b * a.s_local + s;
}
__device__ __forceinline__ int64_t output_row(const NormRopeArgs& a, int64_t token) {
  const int64_t b = token / a.s_local;
  const int64_t seq = a.seq_offset + token % a.s_local;
  return a.sbhd ? seq * a.batch + b : b * a.seq_total + seq;
}

// Each unit's reciprocal RMS from the per-unit sums of squares, deterministic and the same in
// every thread of a token: all_heads: per thread over its units, a warp's butterfly, then the
// warps' partials in warp order (one barrier); per_head: a butterfly over the head's lanes (no
// barrier), or per unit then in unit order through shared memory (one barrier). `buffer`
// alternates between tokens (vector_shared_floats says why).
template <int kUnits>
__device__ __forceinline__ void unit_rstd(const NormRopeArgs& a, const float (&unit_sum)[kUnits],
                                          const int (&head)[kUnits], const bool (&valid)[kUnits],
                                          int per_head_units, int units, float* shared, int buffer,
                                          float (&rstd)[kUnits]) {
  const int d = static_cast<int>(a.head_dim);
  const int N = static_cast<int>(a.heads);
  if (!a.per_head) {
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < kUnits; ++k) acc += unit_sum[k];
    acc = warp_sum(acc);
    float* partial = shared + buffer * 32;
    if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = acc;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += partial[w];
    const float r = rsqrtf(total / static_cast<float>(N * d) + a.eps);
#pragma unroll
    for (int k = 0; k < kUnits; ++k) rstd[k] = r;
  } else if (shuffle_sums(per_head_units)) {
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      float acc = unit_sum[k];  // invalid units hold 0, and fill whole groups of lanes
      for (int offset = per_head_units / 2; offset > 0; offset /= 2)
        acc += __shfl_xor_sync(0xffffffffu, acc, offset);
      rstd[k] = rsqrtf(acc / static_cast<float>(d) + a.eps);
    }
  } else {
    float* sums = shared + kPartialFloats + buffer * units;
#pragma unroll
    for (int k = 0; k < kUnits; ++k)
      if (valid[k]) sums[threadIdx.x + k * blockDim.x] = unit_sum[k];
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      float acc = 0.f;
      if (valid[k])
        for (int u = 0; u < per_head_units; ++u) acc += sums[head[k] * per_head_units + u];
      rstd[k] = rsqrtf(acc / static_cast<float>(d) + a.eps);
    }
  }
}

// The sum of squares of one unit's two groups.
template <typename T>
__device__ __forceinline__ float unit_squares(const uint4& ga, const uint4& gb) {
  constexpr int V = Group<T>::kV;
  float fa[V], fb[V];
  unpack<T>(ga, fa);
  unpack<T>(gb, fb);
  float sum = 0.f;
#pragma unroll
  for (int i = 0; i < V; ++i) sum += fa[i] * fa[i] + fb[i] * fb[i];
  return sum;
}

// One unit's weights: V at w + off_a into wab, then V at w + off_b (as normalise_rotate_store
// takes them).
template <int V>
__device__ __forceinline__ void unit_weights(const float* w, int off_a, int off_b, float* wab) {
  load_floats(w + off_a, wab, V);
  load_floats(w + off_b, wab + V, V);
}

// One unit normalised (times its weights wab: unit_weights), rotated by its angles ck, tk (V
// each), rounded once and stored at out + off_a, out + off_b.
template <typename T>
__device__ __forceinline__ void normalise_rotate_store(const NormRopeArgs& a, const uint4& ga,
                                                       const uint4& gb, float rstd,
                                                       const float* wab, int off_a, int off_b,
                                                       const float* ck, const float* tk, T* out) {
  constexpr int V = Group<T>::kV;
  float fa[V], fb[V];
  const float* wa = wab;
  const float* wb = wab + V;
  unpack<T>(ga, fa);
  unpack<T>(gb, fb);
#pragma unroll
  for (int i = 0; i < V; ++i) {
    fa[i] = fa[i] * rstd * wa[i];
    fb[i] = fb[i] * rstd * wb[i];
  }
  float oa[V], ob[V];
  if (a.half_style) {
#pragma unroll
    for (int i = 0; i < V; ++i) {
      oa[i] = fa[i] * ck[i] - fb[i] * tk[i];
      ob[i] = fa[i] * tk[i] + fb[i] * ck[i];
    }
  } else {  // pairs (fa[2p], fa[2p+1]) use angle p, (fb[2p], fb[2p+1]) angle V/2 + p
#pragma unroll
    for (int p = 0; p < V / 2; ++p) {
      oa[2 * p] = fa[2 * p] * ck[p] - fa[2 * p + 1] * tk[p];
      oa[2 * p + 1] = fa[2 * p] * tk[p] + fa[2 * p + 1] * ck[p];
      ob[2 * p] = fb[2 * p] * ck[V / 2 + p] - fb[2 * p + 1] * tk[V / 2 + p];
      ob[2 * p + 1] = fb[2 * p] * tk[V / 2 + p] + fb[2 * p + 1] * ck[V / 2 + p];
    }
  }
  __stcs(reinterpret_cast<uint4*>(out + off_a), pack<T>(oa));
  __stcs(reinterpret_cast<uint4*>(out + off_b), pack<T>(ob));
}

}  // namespace fast_ulysses::kernels::device

namespace fast_ulysses::kernels {

// The bulk-copy vector kernel (norm_rope_bulk.cu), where it applies: a device of compute
// capability 9.0 or newer, one or two units per thread, and a block's shared memory within
// 48 KiB. Returns false, launching nothing, where it does not apply; else the launch's error in
// *error.
bool launch_norm_rope_bulk(const NormRopeArgs& a, int units_per_thread, int threads,
                           cudaStream_t stream, cudaError_t* error);

}  // namespace fast_ulysses::kernels
