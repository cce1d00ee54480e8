// Issues one plan descriptor as a single CUDA memcpy (1D, 2D or 3D after coalescing). Between
// two devices the driver runs it on a copy engine, not on SMs; on one device it is a kernel.
// Pitched copies whose rows, pitches or addresses are not multiples of kCopyEngineAlignment go
// to torch's strided copy kernel instead (copy_engine.cpp says why): any row width works.
#pragma once

#include <ATen/core/Tensor.h>
#include <cuda_runtime_api.h>

#include <vector>

#include "plan/plan.h"

namespace fast_ulysses::transport {

// `src` is the start of the input, `dst` the start of the receiving window. Empty copies are
// skipped. Throws c10::Error on a CUDA error. The current device must be the group's.
void issue_copy(const CopyDescriptor& copy, const char* src, char* dst, cudaStream_t stream);

// Several copies, each into its own destination (no two overlap), issued with one
// cudaMemcpy3DBatchAsync where `batch` allows and the driver takes it (eager streams only: a
// batch is not capturable), else one call per copy. Copies within a batch run in no particular order, so
// never put two dependent copies, or a flag write, in one.
struct PeerCopy {
  const CopyDescriptor* copy;
  const char* src;  // the start of the input
  char* dst;        // the start of the receiving window
};
void issue_copies(const std::vector<PeerCopy>& copies, cudaStream_t stream, bool batch);

// This rank's own share, on the current stream: torch's strided copy kernel over views that
// the descriptor describes. A same-device copy is an SM kernel either way, and this one ran
// ~1.7x faster than cudaMemcpy2DAsync at 1280-byte rows on an H200 (docs/BENCHMARK.md).
// `window` is my window as a tensor of x's dtype.
void copy_local(const CopyDescriptor& copy, const at::Tensor& x, const at::Tensor& window);

}  // namespace fast_ulysses::transport
