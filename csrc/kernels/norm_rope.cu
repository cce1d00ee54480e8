#include "kernels/norm_rope_launch.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

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
    int j = 0;
    while (j + 1 < a.peers && h >= a.head_start[j + 1]) ++j;
    const int64_t owned = a.head_start[j + 1] - a.head_start[j];
    const int64_t k = h - a.head_start[j];
    const int64_t seq = a.seq_offset + s;
    const int64_t out_row = a.sbhd ? seq * a.batch + b : b * a.seq_total + seq;
    T* out = reinterpret_cast<T*>(a.dst[j]) + (out_row * owned + k) * d;
    store(out + e0, y0 * c - y1 * t);
    store(out + e1, y0 * t + y1 * c);
  }
}

}  // namespace

cudaError_t launch_norm_rope(const NormRopeArgs& args, cudaStream_t stream) {
  const int64_t tokens = args.batch * args.s_local;
  if (tokens == 0 || args.heads == 0) return cudaSuccess;
  const size_t shared = static_cast<size_t>(args.heads) * sizeof(float);
  switch (args.type) {
    case ElementType::kBFloat16:
      norm_rope_kernel<__nv_bfloat16><<<tokens, kThreads, shared, stream>>>(args);
      break;
    case ElementType::kFloat16:
      norm_rope_kernel<__half><<<tokens, kThreads, shared, stream>>>(args);
      break;
    case ElementType::kFloat32:
      norm_rope_kernel<float><<<tokens, kThreads, shared, stream>>>(args);
      break;
  }
  return cudaGetLastError();
}

}  // namespace fast_ulysses::kernels
