// Driver entry points the transport needs, resolved at run time through the CUDA runtime
// (cudaGetDriverEntryPointByVersion), so the library has no link-time dependency on libcuda and
// imports on a machine with no driver. Resolution happens on first use, which needs a driver.
#pragma once

#include <cuda.h>

namespace fast_ulysses::transport {

struct DriverApi {
  // cuStreamBatchMemOp (the v2 ABI of CUDA 12+): capturable, fewer than 256 ops per call.
  CUresult (*stream_batch_mem_op)(CUstream, unsigned int, CUstreamBatchMemOpParams*,
                                  unsigned int) = nullptr;
  // cuPointerGetAttribute: an allocation's process-wide unique buffer ID (eager_graph.h).
  CUresult (*pointer_get_attribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
  // cuDeviceGet, cuDeviceGetAttribute: whether the device takes 64-bit memory operations.
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*device_get_attribute)(int*, CUdevice_attribute, CUdevice) = nullptr;

  // Resolves once per process; throws (c10::Error) naming the missing entry point.
  static const DriverApi& get();
};

// Whether CUDA device `device_index` supports 64-bit stream memory operations
// (CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS); false where the driver cannot say.
bool supports_64_bit_mem_ops(int device_index);

}  // namespace fast_ulysses::transport
