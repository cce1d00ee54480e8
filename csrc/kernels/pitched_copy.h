// A pitched 3D copy on the SMs, launched directly: this rank's own share of a call, and any
// remote copy whose rows the driver's pitched copies are not given (copy_engine.cpp). It does
// what torch's strided copy_ did there, without building tensor views and a TensorIterator on
// every call (about 10 us of host time per call on an H200 machine).
// Plain C++ with the CUDA runtime's types only; the geometry is the plan's CopyDescriptor.
#pragma once

#include <cuda_runtime_api.h>

#include "plan/plan.h"

namespace fast_ulysses::kernels {

// Executes `copy` (its peer field unused) from src + copy.src_offset to dst + copy.dst_offset.
// Source and destination must not overlap. Launches nothing for an empty copy; returns the
// launch's error (cudaSuccess).
cudaError_t launch_pitched_copy(const CopyDescriptor& copy, const void* src, void* dst,
                                cudaStream_t stream);

}  // namespace fast_ulysses::kernels
