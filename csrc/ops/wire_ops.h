// The FP8 wire's ops (python/fast_ulysses/wire.py states the rule): their argument rules, Meta
// kernels and CPU kernels (which run the rule of csrc/kernels/wire_rule.h). No CUDA kernels
// yet: on the GPU, wire.py runs the torch reference.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace fast_ulysses::ops {

// x: bf16, fp16 or fp32 with a last dimension d >= 1; wire_dtype: float8_e4m3fn or
// float8_e5m2. Returns the packed tensor's shape (x's, d + 4 last). ValueError otherwise.
std::vector<int64_t> check_wire_quantize(const at::Tensor& x, at::ScalarType wire_dtype);
// packed: an FP8 wire dtype with a last dimension d + 4 > 4; dtype: bf16, fp16 or fp32.
// Returns the output's shape (packed's, d last). ValueError otherwise.
std::vector<int64_t> check_wire_dequantize(const at::Tensor& packed, at::ScalarType dtype);
// `out` for wire_dequantize_out: on packed's device, of a wire input dtype, contiguous, of the
// output's shape. ValueError otherwise.
void check_wire_out(const at::Tensor& packed, const at::Tensor& out);

at::Tensor wire_quantize_meta(const at::Tensor& x, at::ScalarType wire_dtype);
at::Tensor wire_dequantize_meta(const at::Tensor& packed, at::ScalarType dtype);
at::Tensor& wire_dequantize_out_meta(const at::Tensor& packed, at::Tensor& out);

at::Tensor wire_quantize_cpu(const at::Tensor& x, at::ScalarType wire_dtype);
at::Tensor wire_dequantize_cpu(const at::Tensor& packed, at::ScalarType dtype);
at::Tensor& wire_dequantize_out_cpu(const at::Tensor& packed, at::Tensor& out);

}  // namespace fast_ulysses::ops
