// Issues one plan descriptor as a single CUDA memcpy (1D, 2D or 3D after coalescing). Between
// two devices the driver runs it on a copy engine, not on SMs; on one device it is a kernel.
// Pitched copies whose rows, pitches or addresses are not multiples of kCopyEngineAlignment go
// to our pitched copy kernel instead (copy_engine.cpp says why): any row width works.
#pragma once

#include <cuda_runtime_api.h>

#include <vector>

#include "plan/plan.h"

namespace fast_ulysses::transport {

// `src` is the start of the input, `dst` the start of the receiving window. Empty copies are
// skipped. Throws c10::Error on a CUDA error. The current device must be the group's.
void issue_copy(const CopyDescriptor& copy, const char* src, char* dst, cudaStream_t stream);

// Several copies, each into its own destination (no two overlap), issued with one
// cudaMemcpy3DBatchAsync where `batch` allows and the driver takes it (eager streams only: a
// batch is not capturable), else one call per copy. Copies within a batch run in no particular
// order, so never put two dependent copies, or a flag write, in one.
struct PeerCopy {
  const CopyDescriptor* copy;
  const char* src;  // the start of the input
  char* dst;        // the start of the receiving window
};
void issue_copies(const std::vector<PeerCopy>& copies, cudaStream_t stream, bool batch);

// One plan descriptor copied by the SM pitched copy kernel (kernels/pitched_copy.h) on `stream`,
// launched directly: this rank's own share of a pitched call (a same-device copy is an SM copy
// either way, and this one costs a kernel launch of host time, not torch's view and
// TensorIterator setup), and the remote copies the driver's pitched calls are not given.
void copy_by_kernel(const CopyDescriptor& copy, const char* src, char* dst, cudaStream_t stream);

}  // namespace fast_ulysses::transport
