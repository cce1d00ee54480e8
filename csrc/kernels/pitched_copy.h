// A pitched 3D copy on the SMs, launched directly: this rank's own share of a call, and any
// remote copy whose rows the driver's pitched copies are not given (copy_engine.cpp). It does
// what torch's strided copy_ did there, without building tensor views and a TensorIterator on
// every call (about 10 us of host time per call on an H200 machine).
// Plain C++ with the CUDA runtime's types only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace fast_ulysses::kernels {

// depth slices of height rows of width bytes; pitches in bytes. Source and destination must not
// overlap. Launches nothing for an empty copy; returns the launch's error (cudaSuccess).
struct PitchedCopy {
  const void* src = nullptr;
  void* dst = nullptr;
  int64_t width = 0;
  int64_t height = 0;
  int64_t depth = 0;
  int64_t src_pitch = 0;
  int64_t dst_pitch = 0;
  int64_t src_slice_pitch = 0;
  int64_t dst_slice_pitch = 0;
};
cudaError_t launch_pitched_copy(const PitchedCopy& copy, cudaStream_t stream);

}  // namespace fast_ulysses::kernels
