// Host time of the driver calls a P = 8 call is made of, alone, without torch and without peers:
// what one cudaGraphLaunch costs for graphs shaped like the transport's cached graph (opening
// memop batch, seven pitched copies, closing memop batch, an own-share branch) and for parts of
// it, beside the same work issued call by call and beside an event record + wait. It sets the
// floor under the host-time goal of a call on this machine: run one process alone, then several
// at once on the same GPU (as the ranks sharing one GPU do). From the repository root:
//
//   nvcc -O2 -arch=sm_90 -std=c++17 csrc/probes/launch_probe.cu -lcuda -o /tmp/launch_probe
//   /tmp/launch_probe                       # one process
//   for i in $(seq 8); do /tmp/launch_probe --quiet & done; wait   # eight at once
//
// Each case: 20 rounds of 64 issues while a spin kernel keeps the GPU busy (so the host never
// waits for the device), microseconds per issue: median and 90th percentile of the rounds.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#define CK(x)                                                                  \
  do {                                                                         \
    cudaError_t err_ = (x);                                                    \
    if (err_ != cudaSuccess) {                                                 \
      std::printf("CUDA %s at line %d\n", cudaGetErrorString(err_), __LINE__); \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)
#define CU(x)                                                                 \
  do {                                                                        \
    CUresult r = (x);                                                         \
    if (r != CUDA_SUCCESS) {                                                  \
      std::printf("CU error %d at line %d\n", static_cast<int>(r), __LINE__); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

namespace {

constexpr int kPeers = 7;  // P = 8
constexpr int kRounds = 20;
constexpr int kPerRound = 64;

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
__global__ void tiny() {}

struct Buffers {
  char* src = nullptr;
  char* dst = nullptr;
  uint32_t* flags = nullptr;  // 2 * kPeers words, each set to 1 before waits are issued
};

// One pitched copy per peer: 16 rows of 256 bytes from a pitch of 1024, the shape of a mode-0
// chunk (small, so the device's part stays short).
void pitched_copies(const Buffers& b, cudaStream_t s) {
  for (int p = 0; p < kPeers; ++p) {
    cudaMemcpy3DParms m = {};
    m.srcPtr = make_cudaPitchedPtr(b.src + p * 256, 1024, 256, 16);
    m.dstPtr = make_cudaPitchedPtr(b.dst + p * 4096, 256, 256, 16);
    m.extent = make_cudaExtent(256, 16, 1);
    m.kind = cudaMemcpyDeviceToDevice;
    CK(cudaMemcpy3DAsync(&m, s));
  }
}

// A handshake batch: a write to each peer's flag and a wait on each (already satisfied).
void memop_batch(const Buffers& b, cudaStream_t s, int base) {
  std::vector<CUstreamBatchMemOpParams> ops;
  for (int p = 0; p < kPeers; ++p) {
    CUstreamBatchMemOpParams w = {};
    w.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
    w.writeValue.address = reinterpret_cast<CUdeviceptr>(b.flags + base + p);
    w.writeValue.value = 1;
    ops.push_back(w);
  }
  for (int p = 0; p < kPeers; ++p) {
    CUstreamBatchMemOpParams w = {};
    w.waitValue.operation = CU_STREAM_MEM_OP_WAIT_VALUE_32;
    w.waitValue.address = reinterpret_cast<CUdeviceptr>(b.flags + base + p);
    w.waitValue.value = 1;
    w.waitValue.flags = CU_STREAM_WAIT_VALUE_GEQ;
    ops.push_back(w);
  }
  CU(cuStreamBatchMemOp(s, static_cast<unsigned>(ops.size()), ops.data(), 0));
}

cudaGraphExec_t capture(cudaStream_t s, const std::function<void(cudaStream_t)>& work) {
  cudaGraph_t g = nullptr;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  work(s);
  CK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t exec = nullptr;
  CK(cudaGraphInstantiate(&exec, g, 0));
  CK(cudaGraphDestroy(g));
  return exec;
}

struct Row {
  std::string name;
  double median, p90;
};

Row time_case(const std::string& name, cudaStream_t s, const std::function<void()>& issue_one) {
  // (`s`: the stream the issued work goes on, kept busy by the spin kernel.)
  std::vector<double> us;
  for (int round = 0; round < kRounds + 2; ++round) {
    spin<<<1, 1, 0, s>>>(50000000LL);  // ~25 ms at 2 GHz: the GPU stays busy below
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kPerRound; ++i) issue_one();
    const auto t1 = std::chrono::steady_clock::now();
    CK(cudaStreamSynchronize(s));
    if (round >= 2)
      us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / kPerRound);
  }
  std::sort(us.begin(), us.end());
  return {name, us[us.size() / 2], us[us.size() * 9 / 10]};
}

}  // namespace

int main(int argc, char** argv) {
  const bool quiet = argc > 1 && std::strcmp(argv[1], "--quiet") == 0;
  CK(cudaSetDevice(0));
  CK(cudaFree(nullptr));
  cudaStream_t s, branch;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&branch, cudaStreamNonBlocking));
  Buffers b;
  CK(cudaMalloc(&b.src, 1 << 20));
  CK(cudaMalloc(&b.dst, 1 << 20));
  CK(cudaMalloc(&b.flags, 4 * kPeers * sizeof(uint32_t)));
  std::vector<uint32_t> ones(4 * kPeers, 1);
  CK(cudaMemcpy(b.flags, ones.data(), ones.size() * 4, cudaMemcpyHostToDevice));
  cudaEvent_t fork, join, ev;
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));

  const auto own_branch = [&](cudaStream_t st) {  // the own share on a branch of the graph
    CK(cudaEventRecord(fork, st));
    CK(cudaStreamWaitEvent(branch, fork, 0));
    CK(cudaMemcpyAsync(b.dst + (1 << 19), b.src + (1 << 19), 4096, cudaMemcpyDeviceToDevice,
                       branch));
    CK(cudaEventRecord(join, branch));
  };
  const auto own_join = [&](cudaStream_t st) { CK(cudaStreamWaitEvent(st, join, 0)); };

  cudaGraphExec_t g_kernel = capture(s, [&](cudaStream_t st) { tiny<<<1, 1, 0, st>>>(); });
  cudaGraphExec_t g_memcpy1 = capture(s, [&](cudaStream_t st) {
    CK(cudaMemcpyAsync(b.dst, b.src, 4096, cudaMemcpyDeviceToDevice, st));
  });
  cudaGraphExec_t g_copies = capture(s, [&](cudaStream_t st) { pitched_copies(b, st); });
  cudaGraphExec_t g_memops = capture(s, [&](cudaStream_t st) {
    memop_batch(b, st, 0);
    memop_batch(b, st, kPeers);
  });
  cudaGraphExec_t g_call = capture(s, [&](cudaStream_t st) {
    own_branch(st);
    memop_batch(b, st, 0);
    pitched_copies(b, st);
    memop_batch(b, st, kPeers);
    own_join(st);
  });
  cudaGraphExec_t g_call_linear = capture(s, [&](cudaStream_t st) {
    memop_batch(b, st, 0);
    pitched_copies(b, st);
    memop_batch(b, st, kPeers);
    CK(cudaMemcpyAsync(b.dst + (1 << 19), b.src + (1 << 19), 4096, cudaMemcpyDeviceToDevice, st));
  });

  std::vector<Row> rows;
  rows.push_back(time_case("event record + stream wait (one join)", s, [&] {
    CK(cudaEventRecord(ev, s));
    CK(cudaStreamWaitEvent(branch, ev, 0));
  }));
  rows.push_back(time_case("kernel launch (empty kernel)", s, [&] { tiny<<<1, 1, 0, s>>>(); }));
  rows.push_back(time_case("cudaMemcpyAsync 4 KB", s, [&] {
    CK(cudaMemcpyAsync(b.dst, b.src, 4096, cudaMemcpyDeviceToDevice, s));
  }));
  rows.push_back(
      time_case("7 x cudaMemcpy3DAsync (pitched), call by call", s, [&] { pitched_copies(b, s); }));
  rows.push_back(time_case("2 x cuStreamBatchMemOp (14 ops each), call by call", s, [&] {
    memop_batch(b, s, 0);
    memop_batch(b, s, kPeers);
  }));
  rows.push_back(
      time_case("graph: one empty kernel", s, [&] { CK(cudaGraphLaunch(g_kernel, s)); }));
  rows.push_back(
      time_case("graph: one 4 KB memcpy", s, [&] { CK(cudaGraphLaunch(g_memcpy1, s)); }));
  rows.push_back(
      time_case("graph: 7 pitched copies", s, [&] { CK(cudaGraphLaunch(g_copies, s)); }));
  rows.push_back(time_case("graph: 2 memop batches", s, [&] { CK(cudaGraphLaunch(g_memops, s)); }));
  rows.push_back(time_case("graph: a P = 8 call (memops, 7 copies, own share on a branch)", s,
                           [&] { CK(cudaGraphLaunch(g_call, s)); }));
  rows.push_back(time_case("graph: a P = 8 call, own share in line", s,
                           [&] { CK(cudaGraphLaunch(g_call_linear, s)); }));
  rows.push_back(time_case("a P = 8 call's graph + one event record (the watchdog's)", s, [&] {
    CK(cudaGraphLaunch(g_call, s));
    CK(cudaEventRecord(ev, s));
  }));
  // Where torch's callers are: its default stream is the legacy NULL stream.
  cudaStream_t legacy = cudaStreamLegacy;
  rows.push_back(time_case("graph: a P = 8 call, on the legacy default stream", legacy,
                           [&] { CK(cudaGraphLaunch(g_call, legacy)); }));
  rows.push_back(time_case("  the same + one event record on it (the watchdog's)", legacy, [&] {
    CK(cudaGraphLaunch(g_call, legacy));
    CK(cudaEventRecord(ev, legacy));
  }));
  rows.push_back(
      time_case("graph: a P = 8 call on a side stream, forked from and joined to "
                "the legacy stream",
                legacy, [&] {
                  CK(cudaEventRecord(fork, legacy));
                  CK(cudaStreamWaitEvent(s, fork, 0));
                  CK(cudaGraphLaunch(g_call, s));
                  CK(cudaEventRecord(join, s));
                  CK(cudaStreamWaitEvent(legacy, join, 0));
                }));
  rows.push_back(time_case("cuPointerGetAttribute(BUFFER_ID), twice (the cache's key)", s, [&] {
    unsigned long long id = 0;
    CU(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                             reinterpret_cast<CUdeviceptr>(b.src)));
    CU(cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID,
                             reinterpret_cast<CUdeviceptr>(b.dst)));
  }));
  rows.push_back(time_case("the same work call by call (no graph)", s, [&] {
    own_branch(s);
    memop_batch(b, s, 0);
    pitched_copies(b, s);
    memop_batch(b, s, kPeers);
    own_join(s);
  }));
  CK(cudaDeviceSynchronize());
  if (!quiet) std::printf("%-66s %9s %9s\n", "host us per issue (GPU kept busy)", "median", "p90");
  for (const Row& r : rows) std::printf("%-66s %9.2f %9.2f\n", r.name.c_str(), r.median, r.p90);
  return 0;
}
