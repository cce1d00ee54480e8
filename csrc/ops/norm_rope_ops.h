// The fused QK RMSNorm + RoPE scatter's argument rules, in one place: the fast op
// (cuda_ops.cpp) applies them before launching, and the Python API asks them (through the op
// check_norm_rope, traceable: schemas.cpp) before the fallback's unfused math, so both groups
// refuse a bad call in the same words.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "kernels/norm_rope.h"
#include "ops/call_args.h"

namespace fast_ulysses::ops {

// Checks x (4-d, any strides, bf16/fp16/fp32, layout bshd or sbhd, even d), norm_weight (float32,
// N*d values for norm="all_heads" or d for "per_head"), cos and sin (float32 contiguous
// (s_local, d/2)), all on x's device, and the names; returns the kernel's arguments without
// the splits and destinations. Raises c10::ValueError naming the argument and the rule. (The fast
// op's kernel reads x dense: it passes x.contiguous(), a copy only for a strided x.)
kernels::NormRopeArgs check_norm_rope(const at::Tensor& x, const at::Tensor& norm_weight,
                                      double eps, const at::Tensor& cos, const at::Tensor& sin,
                                      const std::string& norm, const std::string& rope_style,
                                      const std::string& layout);

// The names norm= and rope_style= take, in order (`_C.NORMS`, `_C.ROPE_STYLES`).
std::tuple<std::vector<std::string>, std::vector<std::string>> norm_rope_choices_op();

// The op's CompositeExplicitAutograd kernel (the checks alone).
void check_norm_rope_op(const at::Tensor& x, const at::Tensor& norm_weight, double eps,
                        const at::Tensor& cos, const at::Tensor& sin, std::string norm,
                        std::string rope_style, std::string layout);

// The fused op's Meta kernel (torch.compile traces it): the checks, then the mode-0 output.
at::Tensor qk_norm_rope_meta(const at::Tensor& x FU_FUSED_ARGS(FU_PARAM));

}  // namespace fast_ulysses::ops
