// The fused norm + RoPE vector kernel fed by bulk copies (the Hopper TMA's non-tensor form,
// cp.async.bulk): one thread copies each token's whole row of x and its cos and sin rows into a
// shared-memory stage, and an mbarrier says when the bytes have landed. The next token is in
// flight while this one is summed, normalised, rotated and stored, and no register holds it:
// the registers hold each thread's weights instead, loaded once for all its tokens. Same math,
// same order of summation, same bits as the register-prefetching kernel (norm_rope.cu,
// norm_rope_device.cuh).
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/norm_rope_device.cuh"

namespace fast_ulysses::kernels {
namespace {

using namespace device;

// Two stages: one token in flight while one is worked on. Three and four were measured no
// faster on the H200 (docs/BENCHMARK.md), and two keep a block's shared memory smallest.
constexpr int kStages = 2;
// A block's shared memory without the opt-in attribute; larger rows take the register kernel.
constexpr size_t kMaxShared = 48 * 1024;
// Stages start past the mbarriers, 128 bytes in.
constexpr size_t kBarrierBytes = 128;

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define FU_BULK_COPIES 1
#endif

#ifdef FU_BULK_COPIES
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void barrier_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(bar)));
}
__device__ __forceinline__ void barrier_expect(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(bar)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void barrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait;\n"
      "}\n" ::"r"(shared_address(bar)),
      "r"(parity)
      : "memory");
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes,
                                          uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(shared_address(dst)),
      "l"(src), "r"(bytes), "r"(shared_address(bar))
      : "memory");
}
#endif

// Bytes of one stage: the token's row of x, then its d/2 cos and d/2 sin (all multiples of 16,
// which the bulk copy needs: d is a multiple of 2V).
__host__ __device__ inline size_t stage_bytes(const NormRopeArgs& a, int element_bytes) {
  return static_cast<size_t>(a.heads) * a.head_dim * element_bytes + a.head_dim * sizeof(float);
}

// kMaxThreads and kMinBlocks cap the registers (65536 / (kMaxThreads * kMinBlocks)): the
// instantiations below hold three blocks of 160 (Wan, 40 heads) or 192 (HunyuanVideo, 24
// heads) threads per multiprocessor (128 and 96 registers with the held weights; at four
// blocks the held weights spill). The held weights at three blocks were measured faster than
// per-token weight loads at four blocks (docs/BENCHMARK.md). A block
// runs tokens blockIdx.x, + gridDim.x, ...; the grid is one wave (launch_norm_rope_bulk).
template <typename T, int kUnits, int kMaxThreads, int kMinBlocks>
__global__ void __launch_bounds__(kMaxThreads, kMinBlocks) norm_rope_bulk_kernel(NormRopeArgs a) {
#ifdef FU_BULK_COPIES
  constexpr int V = Group<T>::kV;
  extern __shared__ __align__(128) unsigned char raw[];
  const int d = static_cast<int>(a.head_dim);
  const int half = d / 2;
  const int per_head_units = d / (2 * V);
  const int units = static_cast<int>(a.heads) * per_head_units;
  const int64_t tokens = a.batch * a.s_local;
  const uint32_t row_bytes = static_cast<uint32_t>(a.heads * a.head_dim * sizeof(T));
  const uint32_t angle_bytes = static_cast<uint32_t>(half * sizeof(float));
  const uint32_t stage_size = static_cast<uint32_t>(stage_bytes(a, sizeof(T)));
  uint64_t* bars = reinterpret_cast<uint64_t*>(raw);
  unsigned char* stages = raw + kBarrierBytes;
  float* shared = reinterpret_cast<float*>(stages + kStages * stage_size);
  const ThreadUnits<T, kUnits> u(a, units, per_head_units);

  // Thread 0 only: token t's row and angles into `stage`, completing the stage's barrier.
  const auto fill = [&](int stage, int64_t token) {
    unsigned char* dst = stages + stage * stage_size;
    const int64_t s = token % a.s_local;
    barrier_expect(&bars[stage], stage_size);
    bulk_copy(dst, static_cast<const T*>(a.x) + input_row(a, token) * a.heads * a.head_dim,
              row_bytes, &bars[stage]);
    bulk_copy(dst + row_bytes, a.cos + s * half, angle_bytes, &bars[stage]);
    bulk_copy(dst + row_bytes + angle_bytes, a.sin + s * half, angle_bytes, &bars[stage]);
  };
  if (threadIdx.x == 0) {
    for (int i = 0; i < kStages; ++i) barrier_init(&bars[i]);
    // The initialised barriers must be visible to the bulk copies (the async proxy).
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncthreads();
  if (threadIdx.x == 0)
    for (int i = 0; i < kStages; ++i) {
      const int64_t token = blockIdx.x + static_cast<int64_t>(i) * gridDim.x;
      if (token < tokens) fill(i, token);
    }

  // Each thread's units are the same for every token: their weights, loaded once and held in
  // registers (per token they were 2 KB of L1 loads a warp).
  float held[kUnits][2 * V];
#pragma unroll
  for (int k = 0; k < kUnits; ++k)
    if (u.valid[k])
      unit_weights<V>(a.per_head ? a.weight : a.weight + static_cast<int64_t>(u.head[k]) * d,
                      u.off_a[k], u.off_b[k], held[k]);

  int turn = 0;
  for (int64_t token = blockIdx.x; token < tokens; token += gridDim.x, ++turn) {
    const int stage = turn % kStages;
    barrier_wait(&bars[stage], (turn / kStages) & 1);
    const unsigned char* here = stages + stage * stage_size;
    const T* in = reinterpret_cast<const T*>(here);
    const float* cos_row = reinterpret_cast<const float*>(here + row_bytes);
    const float* sin_row = reinterpret_cast<const float*>(here + row_bytes + angle_bytes);

    uint4 ga[kUnits], gb[kUnits];
    float unit_sum[kUnits];
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      unit_sum[k] = 0.f;
      if (!u.valid[k]) continue;
      const T* h = in + u.head[k] * d;
      ga[k] = *reinterpret_cast<const uint4*>(h + u.off_a[k]);
      gb[k] = *reinterpret_cast<const uint4*>(h + u.off_b[k]);
      unit_sum[k] = unit_squares<T>(ga[k], gb[k]);
    }
    float rstd[kUnits];
    unit_rstd<kUnits>(a, unit_sum, u.head, u.valid, per_head_units, units, shared, turn & 1, rstd);

    const int64_t out_row = output_row(a, token);
#pragma unroll
    for (int k = 0; k < kUnits; ++k) {
      if (!u.valid[k]) continue;
      float ck[V], tk[V];
      unit_angles<V, false>(cos_row, sin_row, u.index[k], d, a.half_style, ck, tk);
      normalise_rotate_store<T>(a, ga[k], gb[k], rstd[k], held[k], u.off_a[k], u.off_b[k], ck, tk,
                                u.out_base[k] + out_row * u.out_pitch[k]);
    }
    // Every thread has read this stage: refill it with the token kStages turns ahead.
    __syncthreads();
    const int64_t ahead = token + static_cast<int64_t>(kStages) * gridDim.x;
    if (threadIdx.x == 0 && ahead < tokens) fill(stage, ahead);
  }
#else
  __trap();  // never launched from code compiled below compute_90 (launch: ptx_version)
#endif
}

// Blocks per multiprocessor for (kernel, threads, shared bytes) on the current device, and the
// device's multiprocessor count: asked of the runtime once, then cached (the launch is on the
// hot path of every fused call).
struct Occupancy {
  int blocks_per_sm = 0;
  int multiprocessors = 0;
  // The virtual architecture the loaded kernel was compiled for (90 for compute_90), not the
  // device's: a build without sm_90 code runs on an H100 from older PTX, whose body is the
  // __trap() above, so the choice follows the binary.
  int ptx_version = 0;
};
Occupancy occupancy(const void* kernel, int threads, size_t shared, cudaError_t* error) {
  static std::mutex mutex;
  static std::map<std::tuple<int, const void*, int, size_t>, Occupancy> cache;
  int device = 0;
  if ((*error = cudaGetDevice(&device)) != cudaSuccess) return {};
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(device, kernel, threads, shared);
  const auto found = cache.find(key);
  if (found != cache.end()) return found->second;
  Occupancy o;
  cudaFuncAttributes attributes{};
  if ((*error = cudaFuncGetAttributes(&attributes, kernel)) != cudaSuccess ||
      (*error = cudaDeviceGetAttribute(&o.multiprocessors, cudaDevAttrMultiProcessorCount,
                                       device)) != cudaSuccess)
    return {};
  o.ptx_version = attributes.ptxVersion;
  if (o.ptx_version >= 90 && (*error = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                                  &o.blocks_per_sm, kernel, threads, shared)) != cudaSuccess)
    return {};
  return cache[key] = o;
}

template <typename T, int kUnits, int kMaxThreads, int kMinBlocks>
bool launch(const NormRopeArgs& a, int threads, cudaStream_t stream, cudaError_t* error) {
  const size_t shared = kBarrierBytes + kStages * stage_bytes(a, sizeof(T)) +
                        static_cast<size_t>(vector_shared_floats(
                            static_cast<int>(a.heads * (a.head_dim / (2 * Group<T>::kV))))) *
                            sizeof(float);
  if (threads > kMaxThreads || shared > kMaxShared) return false;
  const auto kernel = norm_rope_bulk_kernel<T, kUnits, kMaxThreads, kMinBlocks>;
  const Occupancy o = occupancy(reinterpret_cast<const void*>(kernel), threads, shared, error);
  if (*error != cudaSuccess) return true;  // the error is the answer
  if (o.ptx_version < 90 || o.blocks_per_sm < 1) return false;
  const int64_t tokens = a.batch * a.s_local;
  const int64_t grid = std::min<int64_t>(tokens, int64_t{o.blocks_per_sm} * o.multiprocessors);
  kernel<<<static_cast<unsigned>(grid), threads, shared, stream>>>(a);
  *error = cudaGetLastError();
  return true;
}

template <typename T>
bool launch_type(const NormRopeArgs& a, int units_per_thread, int threads, cudaStream_t stream,
                 cudaError_t* error) {
  if (units_per_thread == 1) return launch<T, 1, 256, 2>(a, threads, stream, error);
  if (units_per_thread != 2) return false;
  return launch<T, 2, 160, 3>(a, threads, stream, error) ||
         launch<T, 2, 512, 1>(a, threads, stream, error);
}

}  // namespace

bool launch_norm_rope_bulk(const NormRopeArgs& a, int units_per_thread, int threads,
                           cudaStream_t stream, cudaError_t* error) {
  *error = cudaSuccess;
  switch (a.type) {
    case ElementType::kBFloat16:
      return launch_type<__nv_bfloat16>(a, units_per_thread, threads, stream, error);
    case ElementType::kFloat16:
      return launch_type<__half>(a, units_per_thread, threads, stream, error);
    case ElementType::kFloat32:
      return launch_type<float>(a, units_per_thread, threads, stream, error);
  }
  return false;
}

}  // namespace fast_ulysses::kernels
