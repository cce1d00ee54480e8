// The launch of the fused QK RMSNorm + RoPE scatter (norm_rope.h has its contract).
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/norm_rope.h"

namespace fast_ulysses::kernels {

// Launches the kernel on `stream`; a token-less call launches nothing.
// Returns the launch's error (cudaSuccess).
cudaError_t launch_norm_rope(const NormRopeArgs& args, cudaStream_t stream);

}  // namespace fast_ulysses::kernels
