// Driver entry points the transport needs, resolved at run time through the CUDA runtime
// (cudaGetDriverEntryPointByVersion), so the library has no link-time dependency on libcuda and
// imports on a machine with no driver. Resolution happens on first use, which needs a driver.
#pragma once

#include <cuda.h>

namespace fast_ulysses::transport {

struct DriverApi {
  CUresult (*stream_write_value64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int) = nullptr;
  CUresult (*stream_wait_value64)(CUstream, CUdeviceptr, cuuint64_t, unsigned int) = nullptr;

  // Resolves once per process; throws (c10::Error) naming the missing entry point.
  static const DriverApi& get();
};

}  // namespace fast_ulysses::transport
