#include "ops/wire_ops.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <array>
#include <cmath>
#include <vector>

#include "kernels/wire_rule.h"

namespace fast_ulysses::ops {
namespace {

bool wire_input(at::ScalarType t) {
  return t == at::kBFloat16 || t == at::kHalf || t == at::kFloat;
}

bool wire_format(at::ScalarType t) {
  return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
}

// The CPU kernels: wire_rule.h row by row, rows in parallel.
constexpr int64_t kRowsPerTask = 256;

template <typename In, typename Format>
void quantize_rows(const In* x, uint8_t* packed, int64_t rows, int64_t d) {
  using namespace kernels;
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const In* src = x + r * d;
      uint8_t* dst = packed + r * (d + 4);
      float amax = 0.0f;
      for (int64_t i = 0; i < d; ++i) amax = wire_amax(amax, std::fabs(static_cast<float>(src[i])));
      const float scale = amax * WireLimits<Format>::kInverseTop;
      for (int64_t i = 0; i < d; ++i)
        dst[i] = wire_quantized<Format>(static_cast<float>(src[i]), scale);
      wire_store_scale(scale, dst + d);
    }
  });
}

// Every FP8 value of a format, decoded once (wire_decoded): a table lookup in place of decoding
// each byte.
template <typename Format>
const std::array<float, 256>& decoded() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> values{};
    for (int bits = 0; bits < 256; ++bits)
      values[bits] = kernels::wire_decoded<Format>(static_cast<uint8_t>(bits));
    return values;
  }();
  return table;
}

template <typename Format, typename Out>
void dequantize_rows(const uint8_t* packed, Out* out, int64_t rows, int64_t d) {
  using namespace kernels;
  const std::array<float, 256>& value = decoded<Format>();
  at::parallel_for(0, rows, kRowsPerTask, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* src = packed + r * (d + 4);
      const float scale = wire_load_scale(src + d);
      for (int64_t i = 0; i < d; ++i) out[r * d + i] = wire_dequantized<Out>(value[src[i]], scale);
    }
  });
}

template <typename Format>
void quantize_from(const at::Tensor& x, at::Tensor& packed) {
  const int64_t d = x.size(-1), rows = x.numel() / d;
  auto* dst = static_cast<uint8_t*>(packed.data_ptr());
  switch (x.scalar_type()) {
    case at::kBFloat16:
      return quantize_rows<c10::BFloat16, Format>(x.const_data_ptr<c10::BFloat16>(), dst, rows, d);
    case at::kHalf:
      return quantize_rows<c10::Half, Format>(x.const_data_ptr<c10::Half>(), dst, rows, d);
    default:
      return quantize_rows<float, Format>(x.const_data_ptr<float>(), dst, rows, d);
  }
}

template <typename Format>
void dequantize_to(const at::Tensor& packed, at::Tensor& out) {
  const int64_t d = out.size(-1), rows = d ? out.numel() / d : 0;
  const auto* src = static_cast<const uint8_t*>(packed.const_data_ptr());
  switch (out.scalar_type()) {
    case at::kBFloat16:
      return dequantize_rows<Format>(src, out.mutable_data_ptr<c10::BFloat16>(), rows, d);
    case at::kHalf:
      return dequantize_rows<Format>(src, out.mutable_data_ptr<c10::Half>(), rows, d);
    default:
      return dequantize_rows<Format>(src, out.mutable_data_ptr<float>(), rows, d);
  }
}

void dequantize_into(const at::Tensor& packed_arg, at::Tensor& out) {
  const c10::MaybeOwned<at::Tensor> packed = packed_arg.expect_contiguous();
  if (packed->scalar_type() == at::kFloat8_e4m3fn) {
    dequantize_to<c10::Float8_e4m3fn>(*packed, out);
  } else {
    dequantize_to<c10::Float8_e5m2>(*packed, out);
  }
}

}  // namespace

std::vector<int64_t> check_wire_quantize(const at::Tensor& x, at::ScalarType wire_dtype) {
  TORCH_CHECK_VALUE(wire_format(wire_dtype), "wire_dtype=", wire_dtype,
                    ": it must be torch.float8_e4m3fn or torch.float8_e5m2");
  TORCH_CHECK_VALUE(wire_input(x.scalar_type()), "x has dtype ", x.scalar_type(),
                    ": a wire call takes bfloat16, float16 or float32");
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) >= 1, "x has shape ", x.sizes(),
                    ": quantizing needs rows of at least one value (the last dimension)");
  TORCH_CHECK_VALUE(x.size(-1) <= (int64_t{1} << 30), "x's rows hold ", x.size(-1),
                    " values: at most 2^30");
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() += 4;
  return shape;
}

std::vector<int64_t> check_wire_dequantize(const at::Tensor& packed, at::ScalarType dtype) {
  TORCH_CHECK_VALUE(wire_format(packed.scalar_type()), "packed has dtype ", packed.scalar_type(),
                    ": it must be an FP8 wire dtype");
  TORCH_CHECK_VALUE(wire_input(dtype), "dtype=", dtype, ": bfloat16, float16 or float32");
  TORCH_CHECK_VALUE(packed.dim() >= 1 && packed.size(-1) > 4, "packed has shape ", packed.sizes(),
                    ": its rows hold d + 4 values, d >= 1");
  std::vector<int64_t> shape = packed.sizes().vec();
  shape.back() -= 4;
  return shape;
}

void check_wire_out(const at::Tensor& packed, const at::Tensor& out) {
  const std::vector<int64_t> shape = check_wire_dequantize(packed, out.scalar_type());
  TORCH_CHECK_VALUE(out.device() == packed.device(), "out is on ", out.device(),
                    " but packed is on ", packed.device());
  TORCH_CHECK_VALUE(out.sizes() == at::IntArrayRef(shape), "out has shape ", out.sizes(),
                    " but the dequantized rows are ", at::IntArrayRef(shape));
  TORCH_CHECK_VALUE(out.is_contiguous(), "out is not contiguous");
}

at::Tensor wire_quantize_meta(const at::Tensor& x, at::ScalarType wire_dtype) {
  return at::empty(check_wire_quantize(x, wire_dtype), x.options().dtype(wire_dtype));
}

at::Tensor wire_dequantize_meta(const at::Tensor& packed, at::ScalarType dtype) {
  return at::empty(check_wire_dequantize(packed, dtype), packed.options().dtype(dtype));
}

at::Tensor& wire_dequantize_out_meta(const at::Tensor& packed, at::Tensor& out) {
  check_wire_out(packed, out);
  return out;
}

at::Tensor wire_quantize_cpu(const at::Tensor& x_arg, at::ScalarType wire_dtype) {
  const std::vector<int64_t> shape = check_wire_quantize(x_arg, wire_dtype);
  const c10::MaybeOwned<at::Tensor> x = x_arg.expect_contiguous();
  at::Tensor packed = at::empty(shape, x->options().dtype(wire_dtype));
  if (wire_dtype == at::kFloat8_e4m3fn) {
    quantize_from<c10::Float8_e4m3fn>(*x, packed);
  } else {
    quantize_from<c10::Float8_e5m2>(*x, packed);
  }
  return packed;
}

at::Tensor wire_dequantize_cpu(const at::Tensor& packed, at::ScalarType dtype) {
  at::Tensor out = at::empty(check_wire_dequantize(packed, dtype), packed.options().dtype(dtype));
  dequantize_into(packed, out);
  return out;
}

at::Tensor& wire_dequantize_out_cpu(const at::Tensor& packed, at::Tensor& out) {
  check_wire_out(packed, out);
  dequantize_into(packed, out);
  return out;
}

}  // namespace fast_ulysses::ops
