// Error checks for the CUDA runtime and driver calls of the transport.
#pragma once

#include <c10/util/Exception.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#define FU_CUDA_CHECK(expr)                                                                     \
  do {                                                                                          \
    const cudaError_t fu_status = (expr);                                                       \
    TORCH_CHECK(fu_status == cudaSuccess, "fast-ulysses: ", #expr,                              \
                " failed: ", cudaGetErrorName(fu_status), ": ", cudaGetErrorString(fu_status)); \
  } while (0)

#define FU_CU_CHECK(expr)                                                                     \
  do {                                                                                        \
    const CUresult fu_result = (expr);                                                        \
    TORCH_CHECK(fu_result == CUDA_SUCCESS, "fast-ulysses: ", #expr, " failed with CUresult ", \
                static_cast<int>(fu_result));                                                 \
  } while (0)
