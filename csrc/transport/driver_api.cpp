#include "transport/driver_api.h"

#include <cuda_runtime_api.h>

#include "transport/cuda_check.h"

namespace fast_ulysses::transport {
namespace {

// The ABI version of the entry points we call (cuStreamBatchMemOp's v2 form): CUDA 12.0+.
constexpr unsigned int kEntryPointVersion = 12000;

template <typename Fn>
void resolve(const char* name, Fn*& fn) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  FU_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &address, kEntryPointVersion,
                                                 cudaEnableDefault, &found));
  TORCH_CHECK(found == cudaDriverEntryPointSuccess && address != nullptr,
              "fast-ulysses: the CUDA driver has no entry point ", name, " (version ",
              kEntryPointVersion, "); a driver for CUDA 12.0 or newer is needed");
  fn = reinterpret_cast<Fn*>(address);
}

}  // namespace

const DriverApi& DriverApi::get() {
  static const DriverApi api = [] {
    DriverApi resolved;
    resolve("cuStreamBatchMemOp", resolved.stream_batch_mem_op);
    resolve("cuPointerGetAttribute", resolved.pointer_get_attribute);
    resolve("cuDeviceGet", resolved.device_get);
    resolve("cuDeviceGetAttribute", resolved.device_get_attribute);
    return resolved;
  }();
  return api;
}

bool supports_64_bit_mem_ops(int device_index) {
  const DriverApi& api = DriverApi::get();
  CUdevice device = 0;
  int supported = 0;
  return api.device_get(&device, device_index) == CUDA_SUCCESS &&
         api.device_get_attribute(&supported, CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
                                  device) == CUDA_SUCCESS &&
         supported != 0;
}

}  // namespace fast_ulysses::transport
