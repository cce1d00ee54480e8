#include "kernels/norm_rope_launch.h"

#include <algorithm>
#include <cstdint>

#include "kernels/norm_rope_device.cuh"

namespace fast_ulysses::kernels {
namespace {

using namespace device;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

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
    const float rstd =
        a.per_head ? rsqrtf(head_sum[h] / static_cast<float>(d) + a.eps) : token_rstd;
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

template <typename T, int kUnits>
__device__ __forceinline__ void load_token(const NormRopeArgs& a, int64_t token,
                                           const int (&off_a)[kUnits], const int (&off_b)[kUnits],
                                           const int (&head)[kUnits], const bool (&valid)[kUnits],
                                           uint4 (&ga)[kUnits], uint4 (&gb)[kUnits]) {
  const T* in = static_cast<const T*>(a.x) + input_row(a, token) * a.heads * a.head_dim;
#pragma unroll
  for (int k = 0; k < kUnits; ++k) {
    if (!valid[k]) continue;
    const T* h = in + static_cast<int64_t>(head[k]) * a.head_dim;
    ga[k] = __ldcs(reinterpret_cast<const uint4*>(h + off_a[k]));
    gb[k] = __ldcs(reinterpret_cast<const uint4*>(h + off_b[k]));
  }
}

// The register kernel: the vector path where the bulk-copy kernel (norm_rope_bulk.cu) does not
// run (four units per thread, rows too large for its stages, GPUs before compute capability
// 9.0). A block runs tokens blockIdx.x, blockIdx.x + gridDim.x, ...; while it normalises and
// stores one token, the next token's groups are already being loaded into registers, and a
// token's angles are loaded before its sums so their latency hides behind the reduction. Each
// thread keeps kUnits units in registers from the load to the store, so x is read once; the
// sums are unit_rstd's (the same order, so the same bits, as the bulk kernel).
//
// The next token's groups and the early angles take registers, which bounds the blocks per
// multiprocessor (three of 160 threads for Wan on sm_90: why the bulk kernel, which holds the
// next token in shared memory, is faster there). At four units per thread (up to 1024 threads,
// so at most 64 registers) they would spill, so that instantiation loads each token after the
// last one's stores and its angles at the rotation (kPrefetch false). It still spills part of
// the hoisted geometry (ptxas, sm_90: 330-410 bytes of stack).
template <typename T, int kUnits>
__global__ void __launch_bounds__(256 * kUnits) norm_rope_vector_kernel(NormRopeArgs a) {
  constexpr int V = Group<T>::kV;
  constexpr bool kPrefetch = kUnits <= 2;
  extern __shared__ float shared[];
  const int d = static_cast<int>(a.head_dim);
  const int per_head_units = d / (2 * V);
  const int units = static_cast<int>(a.heads) * per_head_units;
  const int64_t tokens = a.batch * a.s_local;
  const ThreadUnits<T, kUnits> u(a, units, per_head_units);

  uint4 ga[kUnits], gb[kUnits];
  int64_t token = blockIdx.x;
  if (token < tokens) load_token<T, kUnits>(a, token, u.off_a, u.off_b, u.head, u.valid, ga, gb);
  for (int buffer = 0; token < tokens; token += gridDim.x, buffer ^= 1) {
    uint4 na[kUnits], nb[kUnits];
    const int64_t next = token + gridDim.x;
    if constexpr (kPrefetch)
      if (next < tokens) load_token<T, kUnits>(a, next, u.off_a, u.off_b, u.head, u.valid, na, nb);
    const int64_t s = token % a.s_local;
    const float* cos_row = a.cos + s * (d / 2);
    const float* sin_row = a.sin + s * (d / 2);
    float c[kUnits][V], t[kUnits][V];
    if constexpr (kPrefetch) {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) {
        if (!u.valid[k]) continue;
        unit_angles<V, true>(cos_row, sin_row, u.index[k], d, a.half_style, c[k], t[k]);
      }
    }

    float unit_sum[kUnits];
#pragma unroll
    for (int k = 0; k < kUnits; ++k) unit_sum[k] = u.valid[k] ? unit_squares<T>(ga[k], gb[k]) : 0.f;
    float rstd[kUnits];
    unit_rstd<kUnits>(a, unit_sum, u.head, u.valid, per_head_units, units, shared, buffer, rstd);

    const int64_t out_row = output_row(a, token);
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      if (!u.valid[k]) continue;
      const float* w = a.per_head ? a.weight : a.weight + static_cast<int64_t>(u.head[k]) * d;
      float wab[2 * V];
      unit_weights<V>(w, u.off_a[k], u.off_b[k], wab);
      if constexpr (kPrefetch) {
        normalise_rotate_store<T>(a, ga[k], gb[k], rstd[k], wab, u.off_a[k], u.off_b[k], c[k], t[k],
                                  u.out_base[k] + out_row * u.out_pitch[k]);
      } else {
        float ck[V], tk[V];
        unit_angles<V, true>(cos_row, sin_row, u.index[k], d, a.half_style, ck, tk);
        normalise_rotate_store<T>(a, ga[k], gb[k], rstd[k], wab, u.off_a[k], u.off_b[k], ck, tk,
                                  u.out_base[k] + out_row * u.out_pitch[k]);
      }
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int k = 0; k < kUnits; ++k) {
        ga[k] = na[k];
        gb[k] = nb[k];
      }
    } else if (next < tokens) {
      load_token<T, kUnits>(a, next, u.off_a, u.off_b, u.head, u.valid, ga, gb);
    }
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// The vector path's preconditions: whole units per head, 16-byte aligned rows everywhere, and
// at most 1024 threads of 4 units per token (256 threads per unit a thread holds). Otherwise
// the scalar kernel runs.
int vector_units_per_thread(const NormRopeArgs& a, int element_bytes) {
  const int64_t V = 16 / element_bytes;
  if (a.head_dim % (2 * V) != 0) return 0;
  if (!aligned16(a.x) || !aligned16(a.weight) || !aligned16(a.cos) || !aligned16(a.sin)) return 0;
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
int64_t tokens_per_block(int64_t tokens) {
  return tokens >= kLongSequence ? 8 : 4;
}

template <typename T>
cudaError_t launch_vector(const NormRopeArgs& a, int units_per_thread, cudaStream_t stream) {
  constexpr int V = Group<T>::kV;
  const int64_t tokens = a.batch * a.s_local;
  const int64_t units = a.heads * (a.head_dim / (2 * V));
  const int64_t per_block = (units + units_per_thread - 1) / units_per_thread;
  const int threads = static_cast<int>(std::max<int64_t>(32, (per_block + 31) / 32 * 32));
  cudaError_t error = cudaSuccess;
  if (launch_norm_rope_bulk(a, units_per_thread, threads, stream, &error)) return error;
  const int64_t per_block_tokens = tokens_per_block(tokens);
  const int64_t blocks = (tokens + per_block_tokens - 1) / per_block_tokens;
  const size_t shared =
      static_cast<size_t>(vector_shared_floats(static_cast<int>(units))) * sizeof(float);
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
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_norm_rope(const NormRopeArgs& args, cudaStream_t stream) {
  const int64_t tokens = args.batch * args.s_local;
  if (tokens == 0 || args.heads == 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(args.heads) * sizeof(float);
  switch (args.type) {
    case ElementType::kBFloat16:
      if (const int k = vector_units_per_thread(args, 2))
        return launch_vector<__nv_bfloat16>(args, k, stream);
      norm_rope_kernel<__nv_bfloat16><<<tokens, kThreads, shared, stream>>>(args);
      break;
    case ElementType::kFloat16:
      if (const int k = vector_units_per_thread(args, 2))
        return launch_vector<__half>(args, k, stream);
      norm_rope_kernel<__half><<<tokens, kThreads, shared, stream>>>(args);
      break;
    case ElementType::kFloat32:
      if (const int k = vector_units_per_thread(args, 4))
        return launch_vector<float>(args, k, stream);
      norm_rope_kernel<float><<<tokens, kThreads, shared, stream>>>(args);
      break;
  }
  return cudaGetLastError();
}

}  // namespace fast_ulysses::kernels
