// The fused QK RMSNorm + RoPE kernel timed alone, without torch, beside the copy ceilings of the
// same bytes: the device's memcpy (what the plain borrowed call costs at P = 1) and a plain
// 16-byte SM copy kernel. Each case is checked against the scalar kernel (worst difference in
// bf16 ulps); for the P > 1 cases it also times rank 0's own share by the pitched copy kernel
// and by cudaMemcpy2DAsync. From the repository root:
//
//   nvcc -O3 -arch=sm_90 -std=c++17 -Icsrc csrc/probes/norm_rope_probe.cu \
//       csrc/kernels/norm_rope_bulk.cu csrc/kernels/pitched_copy.cu -o /tmp/norm_rope_probe
//   /tmp/norm_rope_probe [substring of a case name]
//
// For an A/B against another version of the kernel, point KSRC at that file (an older
// single-file norm_rope.cu: `git show <commit>:csrc/kernels/norm_rope.cu > /tmp/old.cu`, then
// -DKSRC='"/tmp/old.cu"'). Medians of 20 launches after 3 warm-ups, CUDA events.
#ifndef KSRC
#define KSRC "kernels/norm_rope.cu"
#endif
#include KSRC
#include <cuda_bf16.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
#include "kernels/pitched_copy.h"

using namespace fast_ulysses::kernels;
#define CK(x)                                                     \
  do {                                                            \
    cudaError_t e = (x);                                          \
    if (e != cudaSuccess) {                                       \
      printf("CUDA %s at %d\n", cudaGetErrorString(e), __LINE__); \
      exit(1);                                                    \
    }                                                             \
  } while (0)

__global__ void fill(__nv_bfloat16* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995;
    h ^= h >> 15;
    p[i] = __float2bfloat16(((h & 0xffff) / 65536.f - 0.5f) * 4.f);
  }
}
__global__ void fillf(float* p, int64_t n, float lo, float hi, uint32_t seed) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2246822519u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995;
    h ^= h >> 15;
    p[i] = lo + (hi - lo) * ((h & 0xffff) / 65536.f);
  }
}
__global__ void sm_copy(const uint4* __restrict__ s, uint4* __restrict__ d, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x)
    d[i] = s[i];
}
// max |a-b| in units of bf16 ulp of max(|a|,|b|)
__global__ void ulps(const __nv_bfloat16* a, const __nv_bfloat16* b, int64_t n, float* worst) {
  float w = 0;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
       i += (int64_t)gridDim.x * blockDim.x) {
    float x = __bfloat162float(a[i]), y = __bfloat162float(b[i]);
    float m = fmaxf(fabsf(x), fabsf(y));
    float ulp = m > 0 ? exp2f(floorf(log2f(m)) - 7) : 1e-30f;
    w = fmaxf(w, fabsf(x - y) / fmaxf(ulp, 1e-6f));
  }
  atomicMax((int*)worst, __float_as_int(w));
}

template <typename F>
float time_ms(F f, int iters = 20) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  for (int i = 0; i < 3; ++i) f();
  std::vector<float> t;
  for (int i = 0; i < iters; ++i) {
    CK(cudaEventRecord(a));
    f();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Case {
  const char* name;
  int64_t s, N, d;
  bool per_head, half;
  int P;
};

int main(int argc, char** argv) {
  const char* only = argc > 1 ? argv[1] : "";
  Case cases[] = {{"wan-720p P=1", 75600, 40, 128, false, false, 1},
                  {"hunyuan-720p P=1", 118800, 24, 128, true, true, 1},
                  {"wan-720p P=2 (rank 0)", 37800, 40, 128, false, false, 2},
                  {"wan-720p P=4 (rank 0)", 18900, 40, 128, false, false, 4},
                  {"wan-720p P=8 (rank 0)", 9450, 40, 128, false, false, 8},
                  {"hunyuan-720p P=8 (rank 0)", 14850, 24, 128, true, true, 8}};
  for (const Case& c : cases) {
    if (*only && !strstr(c.name, only)) continue;
    const int64_t n = c.s * c.N * c.d;
    const double bytes = 2.0 * n * 2;  // read + write
    __nv_bfloat16 *x, *out, *ref;
    float *w, *cs, *sn, *worst;
    CK(cudaMalloc(&x, n * 2));
    CK(cudaMalloc(&out, n * 2));
    CK(cudaMalloc(&ref, n * 2));
    const int64_t wn = c.per_head ? c.d : c.N * c.d;
    CK(cudaMalloc(&w, wn * 4));
    CK(cudaMalloc(&cs, c.s * c.d / 2 * 4));
    CK(cudaMalloc(&sn, c.s * c.d / 2 * 4));
    CK(cudaMalloc(&worst, 4));
    fill<<<1024, 256>>>(x, n, 1);
    fillf<<<64, 256>>>(w, wn, 0.5f, 1.5f, 2);
    fillf<<<1024, 256>>>(cs, c.s * c.d / 2, -1, 1, 3);
    fillf<<<1024, 256>>>(sn, c.s * c.d / 2, -1, 1, 4);
    NormRopeArgs a;
    a.x = x;
    a.type = ElementType::kBFloat16;
    a.weight = w;
    a.cos = cs;
    a.sin = sn;
    a.eps = 1e-6f;
    a.per_head = c.per_head;
    a.half_style = c.half;
    a.batch = 1;
    a.s_local = c.s;
    a.heads = c.N;
    a.head_dim = c.d;
    a.seq_total = c.s * c.P;
    a.seq_offset = 0;
    a.peers = c.P;
    // P > 1: rank 0's view; every destination is a slice of `out` laid out as that rank's window
    int64_t hs = c.N / c.P, off = 0;
    for (int j = 0; j <= c.P; ++j) a.head_start[j] = j * hs;
    for (int j = 0; j < c.P; ++j) {
      a.dst[j] = (char*)out + off;
      off += c.s * c.P * hs * c.d * 2;
    }
    if (c.P > 1) {  // each window holds all S rows of its heads
      CK(cudaFree(out));
      CK(cudaMalloc(&out, off));
      CK(cudaFree(ref));
      CK(cudaMalloc(&ref, off));
      off = 0;
      for (int j = 0; j < c.P; ++j) {
        a.dst[j] = (char*)out + off;
        off += c.s * c.P * hs * c.d * 2;
      }
    }
    CK(cudaMemset(out, 0, c.P > 1 ? off : n * 2));
    CK(cudaMemset(ref, 0, c.P > 1 ? off : n * 2));
    // reference: the scalar kernel
    NormRopeArgs r = a;
    char* base = (char*)ref;
    for (int j = 0; j < c.P; ++j) r.dst[j] = base + ((char*)a.dst[j] - (char*)out);
    norm_rope_kernel<__nv_bfloat16><<<c.s, 256, c.N * 4>>>(r);
    CK(launch_norm_rope(a, 0));
    CK(cudaDeviceSynchronize());
    CK(cudaMemset(worst, 0, 4));
    ulps<<<1024, 256>>>(out, ref, (c.P > 1 ? off : n * 2) / 2, worst);
    float wu;
    CK(cudaMemcpy(&wu, worst, 4, cudaMemcpyDeviceToHost));
    const float fused = time_ms([&] { launch_norm_rope(a, 0); });
    const float scalar =
        time_ms([&] { norm_rope_kernel<__nv_bfloat16><<<c.s, 256, c.N * 4>>>(r); }, 5);
    const float ce = time_ms([&] { cudaMemcpyAsync(out, x, n * 2, cudaMemcpyDeviceToDevice, 0); });
    const float sm =
        time_ms([&] { sm_copy<<<132 * 16, 256>>>((const uint4*)x, (uint4*)out, n * 2 / 16); });
    float pitched = 0;
    if (c.P > 1) {  // the own share of rank 0 by the pitched copy kernel and by cudaMemcpy2DAsync
      fast_ulysses::CopyDescriptor pc;
      pc.width = hs * c.d * 2;
      pc.height = c.s;
      pc.depth = 1;
      pc.src_pitch = c.N * c.d * 2;
      pc.dst_pitch = hs * c.d * 2;
      pc.src_slice_pitch = pc.src_pitch * c.s;
      pc.dst_slice_pitch = pc.dst_pitch * c.s;
      pitched = time_ms([&] { launch_pitched_copy(pc, x, out, 0); });
      const float ce2d = time_ms([&] {
        cudaMemcpy2DAsync(out, pc.dst_pitch, x, pc.src_pitch, pc.width, c.s,
                          cudaMemcpyDeviceToDevice, 0);
      });
      printf("  own share %.1f MB: pitched kernel %.4f ms (%.0f GB/s), cudaMemcpy2DAsync %.4f ms\n",
             pc.width * c.s / 1e6, pitched, 2.0 * pc.width * c.s / pitched / 1e6, ce2d);
    }
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    printf(
        "%-24s %s fused %.4f ms (%.2f TB/s) | scalar %.3f | memcpy %.4f (%.2f TB/s) | sm copy %.4f "
        "(%.2f TB/s) | fused/memcpy %.2fx | worst %.2f ulp\n",
        c.name, KSRC, fused, bytes / fused / 1e9, scalar, ce, bytes / ce / 1e9, sm,
        bytes / sm / 1e9, fused / ce, wu);
    cudaFree(x);
    cudaFree(out);
    cudaFree(ref);
    cudaFree(w);
    cudaFree(cs);
    cudaFree(sn);
    cudaFree(worst);
  }
  return 0;
}
