// FP8 on the wire: the rule for one row, as the ops' CPU kernels (ops/wire_ops.cpp) run it, in
// float32 (python/fast_ulysses/wire.py states it in words and keeps it in torch operations as
// the reference these equal bit for bit). Host and device code alike, so that a CUDA kernel
// runs the very same rule:
//   scale = amax(|x|) * (1 / fmax)  (a float multiply by the reciprocal rounded to float);
//   payload = scale > 0 ? clamp(x / scale, -fmax, fmax) (IEEE division; a NaN stays NaN) : 0,
//             rounded to the FP8 format by c10's own conversion, as torch's casts are;
//   back: float(payload) * scale, rounded once to the caller's dtype (c10's conversions).
// A packed row is the d payload bytes, then the scale's 4 bytes (native byte order).
#pragma once

#include <c10/macros/Macros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

namespace fast_ulysses::kernels {

// The format's largest finite value (torch.finfo(format).max) and its reciprocal as the rule
// uses it: the double 1 / fmax rounded to float, as torch rounds a Python float scalar.
template <typename Format>
struct WireLimits;

template <>
struct WireLimits<c10::Float8_e4m3fn> {
  static constexpr float kTop = 448.0f;
  static constexpr float kInverseTop = static_cast<float>(1.0 / 448.0);
};

template <>
struct WireLimits<c10::Float8_e5m2> {
  static constexpr float kTop = 57344.0f;
  static constexpr float kInverseTop = static_cast<float>(1.0 / 57344.0);
};

// The larger of two |x| values, keeping a NaN (as torch's amax does).
C10_HOST_DEVICE inline float wire_amax(float a, float b) {
  return (a != a || a > b) ? a : b;
}

// One value's FP8 bits, given its row's scale.
template <typename Format>
C10_HOST_DEVICE inline uint8_t wire_quantized(float v, float scale) {
  if (!(scale > 0.0f)) return Format(0.0f).x;
#ifdef __CUDA_ARCH__
  const float q = __fdiv_rn(v, scale);
#else
  const float q = v / scale;
#endif
  constexpr float top = WireLimits<Format>::kTop;
  // torch's clamp: a NaN stays NaN.
  const float clamped = q != q ? q : (q < -top ? -top : (q > top ? top : q));
  return Format(clamped).x;
}

// One payload byte's value.
template <typename Format>
C10_HOST_DEVICE inline float wire_decoded(uint8_t bits) {
  return static_cast<float>(Format(bits, Format::from_bits()));
}

// A payload value back, rounded once to Out.
template <typename Out>
C10_HOST_DEVICE inline Out wire_dequantized(float payload, float scale) {
  return static_cast<Out>(payload * scale);
}

C10_HOST_DEVICE inline void wire_store_scale(float scale, uint8_t* bytes) {
  memcpy(bytes, &scale, sizeof(scale));
}

C10_HOST_DEVICE inline float wire_load_scale(const uint8_t* bytes) {
  float scale;
  memcpy(&scale, bytes, sizeof(scale));
  return scale;
}

}  // namespace fast_ulysses::kernels
