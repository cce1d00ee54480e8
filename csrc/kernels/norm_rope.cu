#include "kernels/norm_rope_launch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

namespace fast_ulysses::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float load(const __nv_bfloat16* p) { return __bfloat162float(*p); }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }
__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ void store(__nv_bfloat16* p, float v) { *p = __float2bfloat16_rn(v); }
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }
__device__ __forceinline__ void store(float* p, float v) { *p = v; }

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

// One block per token (b, s). Shared memory: one float per head (its sum of squares).
template <typename T>
__global__ void norm_rope_kernel(NormRopeArgs a) {
  extern __shared__ float head_sum[];
  const int64_t token = blockIdx.x;
  const int64_t b = token / a.s_local;
  const int64_t s = token % a.s_local;
  const int64_t N = a.heads;
  const int64_t d = a.head_dim;
  const int64_t half = d / 2;
  const int64_t row = a.sbhd ? s * a.batch + b : b * a.s_local + s;
  const T* in = static_cast<const T*>(a.x) + row * N * d;

  // Pass 1: each warp sums the squares of whole heads.
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  for (int64_t h = warp; h < N; h += kWarps) {
    float acc = 0.f;
    for (int64_t e = lane; e < d; e += 32) {
      const float v = load(in + h * d + e);
      acc += v * v;
    }
    acc = warp_sum(acc);
    if (lane == 0) head_sum[h] = acc;
  }
  __syncthreads();
  float token_rstd = 0.f;
  if (!a.per_head) {
    float total = 0.f;
    for (int64_t h = 0; h < N; ++h) total += head_sum[h];  // the same order in every thread
    token_rstd = rsqrtf(total / static_cast<float>(N * d) + a.eps);
  }

  // Pass 2: each thread normalises and rotates pairs, and stores them at their owner.
  const float* cos_row = a.cos + s * half;
  const float* sin_row = a.sin + s * half;
  for (int64_t p = threadIdx.x; p < N * half; p += kThreads) {
    const int64_t h = p / half;
    const int64_t i = p % half;
    const int64_t e0 = a.half_style ? i : 2 * i;
    const int64_t e1 = a.half_style ? i + half : 2 * i + 1;
    const float rstd = a.per_head ? rsqrtf(head_sum[h] / static_cast<float>(d) + a.eps)
                                  : token_rstd;
    const int64_t w0 = a.per_head ? e0 : h * d + e0;
    const int64_t w1 = a.per_head ? e1 : h * d + e1;
    const float y0 = load(in + h * d + e0) * rstd * a.weight[w0];
    const float y1 = load(in + h * d + e1) * rstd * a.weight[w1];
    const float c = cos_row[i];
    const float t = sin_row[i];
    const int j = owner_of(a, h);
    const int64_t owned = a.head_start[j + 1] - a.head_start[j];
    const int64_t k = h - a.head_start[j];
    const int64_t seq = a.seq_offset + s;
    const int64_t out_row = a.sbhd ? seq * a.batch + b : b * a.seq_total + seq;
    T* out = reinterpret_cast<T*>(a.dst[j]) + (out_row * owned + k) * d;
    store(out + e0, y0 * c - y1 * t);
    store(out + e1, y0 * t + y1 * c);
  }
}

// The vector path: the same math on 16-byte groups. A unit is two groups of V = 16 / sizeof(T)
// elements that hold V whole RoPE pairs: for "interleaved" the adjacent groups at 2uV and
// 2uV + V, for "half" the groups at uV and d/2 + uV; either way the pairs' angles are
// cos/sin[uV .. uV + V). A thread holds kUnits units (norm_rope_vector_kernel below).
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
// head's row.
template <int V>
struct Unit {
  __device__ __forceinline__ Unit(int q, int per_head_units, int d, bool half_style)
      : head(q / per_head_units),
        index(q % per_head_units),
        off_a(half_style ? index * V : 2 * index * V),
        off_b(half_style ? d / 2 + index * V : 2 * index * V + V) {}
  int head, index, off_a, off_b;
};

// The per_head sums go through warp shuffles when a head's units are an aligned power-of-two
// group of at most 32 lanes (they always are aligned: units are numbered q = thread + k *
// blockDim with blockDim a multiple of 32); otherwise through shared memory.
__host__ __device__ constexpr bool shuffle_sums(int per_head_units) {
  return per_head_units > 0 && per_head_units <= 32 &&
         (per_head_units & (per_head_units - 1)) == 0;
}

// Shared memory of the vector kernel, in floats: two buffers of 32 per-warp partials (all_heads)
// and two of one sum per unit (per_head without shuffles). Two of each because a block runs
// several tokens and a fast thread may write token t + 1's sums while a slow one still reads
// token t's; one barrier per token orders the rest.
constexpr int kPartialFloats = 2 * 32;
__host__ __device__ constexpr int vector_shared_floats(int units) {
  return kPartialFloats + 2 * units;
}

template <typename T, int kUnits>
__device__ __forceinline__ void load_token(const NormRopeArgs& a, int64_t token,
                                           const int (&off_a)[kUnits], const int (&off_b)[kUnits],
                                           const int (&head)[kUnits], const bool (&valid)[kUnits],
                                           uint4 (&ga)[kUnits], uint4 (&gb)[kUnits]) {
  const int64_t b = token / a.s_local;
  const int64_t s = token % a.s_local;
  const int64_t row = a.sbhd ? s * a.batch + b : b * a.s_local + s;
  const T* in = static_cast<const T*>(a.x) + row * a.heads * a.head_dim;
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    if (!valid[k]) continue;
    const T* h = in + static_cast<int64_t>(head[k]) * a.head_dim;
    ga[k] = __ldcs(reinterpret_cast<const uint4*>(h + off_a[k]));
    gb[k] = __ldcs(reinterpret_cast<const uint4*>(h + off_b[k]));
  }
}

// A block runs tokens blockIdx.x, blockIdx.x + gridDim.x, ...; while it normalises and stores
// one token, the next token's groups are already being loaded into registers, and a token's
// angles are loaded before its sums so their latency hides behind the reduction. Each thread
// keeps kUnits units in registers from the load to the store, so x is read once. The sums are
// deterministic and the same in every thread of a token: all_heads: per thread over its units,
// a warp's butterfly, then the warps' partials in warp order; per_head: a butterfly over the
// head's lanes, or per unit then in unit order through shared memory.
//
// The next token's groups and the early angles take registers: at four units per thread (up to
// 1024 threads, so at most 64 registers) they would spill, so that instantiation loads each
// token after the last one's stores and its angles at the rotation (kPrefetch false). It still
// spills part of the hoisted geometry (ptxas, sm_90: 350-380 bytes of stack); it serves only
// tokens of more than 1024 units. Holding the next tokens in shared memory (cp.async) instead
// of registers was measured slower (docs/BENCHMARK.md).
template <typename T, int kUnits>
__global__ void __launch_bounds__(256 * kUnits) norm_rope_vector_kernel(NormRopeArgs a) {
  constexpr int V = Group<T>::kV;
  constexpr bool kPrefetch = kUnits <= 2;
  extern __shared__ float shared[];
  const int d = static_cast<int>(a.head_dim);
  const int N = static_cast<int>(a.heads);
  const int per_head_units = d / (2 * V);
  const int units = N * per_head_units;
  const int64_t tokens = a.batch * a.s_local;
  const bool shuffle = shuffle_sums(per_head_units);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const int warps = blockDim.x / 32;

  // The units' geometry and destinations, the same for every token.
  int head[kUnits], index[kUnits], off_a[kUnits], off_b[kUnits];
  bool valid[kUnits];
  T* out_base[kUnits];
  int64_t out_pitch[kUnits];  // elements between two rows of the destination
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    const int q = threadIdx.x + k * blockDim.x;
    valid[k] = q < units;
    const Unit<V> unit(valid[k] ? q : 0, per_head_units, d, a.half_style);
    head[k] = unit.head;
    index[k] = unit.index;
    off_a[k] = unit.off_a;
    off_b[k] = unit.off_b;
    const int j = owner_of(a, unit.head);
    const int64_t owned = a.head_start[j + 1] - a.head_start[j];
    out_base[k] = reinterpret_cast<T*>(a.dst[j]) + (unit.head - a.head_start[j]) * a.head_dim;
    out_pitch[k] = owned * a.head_dim;
  }

  uint4 ga[kUnits], gb[kUnits];
  int64_t token = blockIdx.x;
  if (token < tokens) load_token<T, kUnits>(a, token, off_a, off_b, head, valid, ga, gb);
  for (int buffer = 0; token < tokens; token += gridDim.x, buffer ^= 1) {
    uint4 na[kUnits], nb[kUnits];
    const int64_t next = token + gridDim.x;
    if constexpr (kPrefetch)
      if (next < tokens) load_token<T, kUnits>(a, next, off_a, off_b, head, valid, na, nb);
    const int64_t b = token / a.s_local;
    const int64_t s = token % a.s_local;
    const float* cos_row = a.cos + s * (d / 2);
    const float* sin_row = a.sin + s * (d / 2);
    float c[kUnits][V], t[kUnits][V];
    if constexpr (kPrefetch) {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) {
        if (!valid[k]) continue;
        load_floats(cos_row + index[k] * V, c[k], V);
        load_floats(sin_row + index[k] * V, t[k], V);
      }
    }

    float unit_sum[kUnits];
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      unit_sum[k] = 0.f;
      if (!valid[k]) continue;
      float fa[V], fb[V];
      unpack<T>(ga[k], fa);
      unpack<T>(gb[k], fb);
#pragma unroll
      for (int i = 0; i < V; ++i) unit_sum[k] += fa[i] * fa[i] + fb[i] * fb[i];
    }
    float rstd[kUnits];
    if (!a.per_head) {
      float acc = 0.f;
#pragma unroll
      for (int k = 0; k < kUnits; ++k) acc += unit_sum[k];
      acc = warp_sum(acc);
      float* partial = shared + buffer * 32;
      if (lane == 0) partial[warp] = acc;
      __syncthreads();
      float total = 0.f;
      for (int w = 0; w < warps; ++w) total += partial[w];
      const float r = rsqrtf(total / static_cast<float>(N * d) + a.eps);
#pragma unroll
      for (int k = 0; k < kUnits; ++k) rstd[k] = r;
    } else if (shuffle) {
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

    const int64_t seq = a.seq_offset + s;
    const int64_t out_row = a.sbhd ? seq * a.batch + b : b * a.seq_total + seq;
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      if (!valid[k]) continue;
      const float* w = a.per_head ? a.weight : a.weight + static_cast<int64_t>(head[k]) * d;
      float fa[V], fb[V], wa[V], wb[V];
      unpack<T>(ga[k], fa);
      unpack<T>(gb[k], fb);
      load_floats(w + off_a[k], wa, V);
      load_floats(w + off_b[k], wb, V);
#pragma unroll
      for (int i = 0; i < V; ++i) {
        fa[i] = fa[i] * rstd[k] * wa[i];
        fb[i] = fb[i] * rstd[k] * wb[i];
      }
      float ck[V], tk[V];
      if constexpr (kPrefetch) {
#pragma unroll
        for (int i = 0; i < V; ++i) {
          ck[i] = c[k][i];
          tk[i] = t[k][i];
        }
      } else {
        load_floats(cos_row + index[k] * V, ck, V);
        load_floats(sin_row + index[k] * V, tk, V);
      }
      float oa[V], ob[V];
      if (a.half_style) {
#pragma unroll
        for (int i = 0; i < V; ++i) {
          oa[i] = fa[i] * ck[i] - fb[i] * tk[i];
          ob[i] = fa[i] * tk[i] + fb[i] * ck[i];
        }
      } else {  // pairs (fa[0], fa[1]) .. (fb[V-2], fb[V-1]): pair p uses angle p
#pragma unroll
        for (int p = 0; p < V / 2; ++p) {
          oa[2 * p] = fa[2 * p] * ck[p] - fa[2 * p + 1] * tk[p];
          oa[2 * p + 1] = fa[2 * p] * tk[p] + fa[2 * p + 1] * ck[p];
          ob[2 * p] = fb[2 * p] * ck[V / 2 + p] - fb[2 * p + 1] * tk[V / 2 + p];
          ob[2 * p + 1] = fb[2 * p] * tk[V / 2 + p] + fb[2 * p + 1] * ck[V / 2 + p];
        }
      }
      T* out = out_base[k] + out_row * out_pitch[k];
      __stcs(reinterpret_cast<uint4*>(out + off_a[k]), pack<T>(oa));
      __stcs(reinterpret_cast<uint4*>(out + off_b[k]), pack<T>(ob));
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) {
        ga[k] = na[k];
        gb[k] = nb[k];
      }
    } else if (next < tokens) {
      load_token<T, kUnits>(a, next, off_a, off_b, head, valid, ga, gb);
    }
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The vector path's preconditions: whole units per head, 16-byte aligned rows everywhere, and
// at most 1024 threads of 4 units per token (256 threads per unit a thread holds). Otherwise
// the scalar kernel runs.
int vector_units_per_thread(const NormRopeArgs& a, int element_bytes) {
  const int64_t V = 16 / element_bytes;
  if (a.head_dim % (2 * V) != 0) return 0;
  if (!aligned16(a.x) || !aligned16(a.weight) || !aligned16(a.cos) || !aligned16(a.sin))
    return 0;
  for (int j = 0; j < a.peers; ++j)
    if (!aligned16(a.dst[j])) return 0;
  const int64_t units = a.heads * (a.head_dim / (2 * V));
  if (units <= 256) return 1;
  if (units <= 1024) return 2;
  if (units <= 4096) return 4;
  return 0;
}

// Tokens per block of the vector kernel: enough to overlap one token's loads with the last
// one's math and to spread each unit's hoisted geometry over many tokens, few enough to keep
// every SM busy on short sequences. Eight a block from kLongSequence tokens on (at least 1024
// blocks: every SM of an H200 still holds several), four below; on the H200, Wan 720p at P = 1
// ran 3% faster with eight than with four (docs/BENCHMARK.md).
constexpr int64_t kLongSequence = 8192;
int64_t tokens_per_block(int64_t tokens) { return tokens >= kLongSequence ? 8 : 4; }

template <typename T>
void launch_vector(const NormRopeArgs& a, int units_per_thread, cudaStream_t stream) {
  constexpr int V = Group<T>::kV;
  const int64_t tokens = a.batch * a.s_local;
  const int64_t units = a.heads * (a.head_dim / (2 * V));
  const int64_t per_block = (units + units_per_thread - 1) / units_per_thread;
  const int threads = static_cast<int>(std::max<int64_t>(32, (per_block + 31) / 32 * 32));
  const int64_t per_block_tokens = tokens_per_block(tokens);
  const int64_t blocks = (tokens + per_block_tokens - 1) / per_block_tokens;
  const size_t shared = static_cast<size_t>(vector_shared_floats(static_cast<int>(units))) *
                        sizeof(float);
  switch (units_per_thread) {
    case 1:
      norm_rope_vector_kernel<T, 1><<<blocks, threads, shared, stream>>>(a);
      break;
    case 2:
      norm_rope_vector_kernel<T, 2><<<blocks, threads, shared, stream>>>(a);
      break;
    default:
      norm_rope_vector_kernel<T, 4><<<blocks, threads, shared, stream>>>(a);
      break;
  }
}

}  // namespace

cudaError_t launch_norm_rope(const NormRopeArgs& args, cudaStream_t stream) {
  const int64_t tokens = args.batch * args.s_local;
  if (tokens == 0 || args.heads == 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(args.heads) * sizeof(float);
  switch (args.type) {
    case ElementType::kBFloat16:
      if (const int k = vector_units_per_thread(args, 2)) {
        launch_vector<__nv_bfloat16>(args, k, stream);
      } else {
        norm_rope_kernel<__nv_bfloat16><<<tokens, kThreads, shared, stream>>>(args);
      }
      break;
    case ElementType::kFloat16:
      if (const int k = vector_units_per_thread(args, 2)) {
        launch_vector<__half>(args, k, stream);
      } else {
        norm_rope_kernel<__half><<<tokens, kThreads, shared, stream>>>(args);
      }
      break;
    case ElementType::kFloat32:
      if (const int k = vector_units_per_thread(args, 4)) {
        launch_vector<float>(args, k, stream);
      } else {
        norm_rope_kernel<float><<<tokens, kThreads, shared, stream>>>(args);
      }
      break;
  }
  return cudaGetLastError();
}

}  // namespace fast_ulysses::kernels
