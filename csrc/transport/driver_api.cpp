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
              "fast-ulysses: the CUDA driver has no entry point ", name,
              " (version ", kEntryPointVersion, "); a driver for CUDA 12.0 or newer is needed");
  fn = reinterpret_cast<Fn*>(address);
}

}  // namespace

const DriverApi& DriverApi::get() {
  static const DriverApi api = [] {
    DriverApi resolved;
    resolve("cuStreamBatchMemOp", resolved.stream_batch_mem_op);
    resolve("cuPointerGetAttribute", resolved.pointer_get_attribute);
    return resolved;
  }();
  return api;
}

}  // namespace fast_ulysses::transport
