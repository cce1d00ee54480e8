// Issues one plan descriptor as a single CUDA memcpy (1D, 2D or 3D after coalescing). Between
// two devices the driver runs it on a copy engine, not on SMs; on one device it is a kernel.
#pragma once

#include <cuda_runtime_api.h>

#include "plan/plan.h"

namespace fast_ulysses::transport {

// `src` is the start of the input, `dst` the start of the receiving window. Empty copies are
// skipped. Throws c10::Error on a CUDA error.
void issue_copy(const CopyDescriptor& copy, const char* src, char* dst, cudaStream_t stream);

}  // namespace fast_ulysses::transport
