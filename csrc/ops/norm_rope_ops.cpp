#include "ops/norm_rope_ops.h"

#include <c10/util/Exception.h>

#include <array>
#include <cmath>
#include <sstream>
#include <tuple>
#include <vector>

#include "ops/plan_ops.h"

namespace fast_ulysses::ops {
namespace {

std::string dims(at::IntArrayRef sizes) {
  std::ostringstream out;
  out << sizes;
  return out.str();
}

void check_table(const char* name, const at::Tensor& t, const at::Tensor& x, int64_t rows,
                 int64_t columns) {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat && t.dim() == 2 && t.size(0) == rows &&
                        t.size(1) == columns && t.is_contiguous(),
                    name, " has shape ", dims(t.sizes()), " and dtype ", t.scalar_type(),
                    ": it must be a contiguous float32 tensor of shape [", rows, ", ", columns,
                    "] (this rank's rows, head_dim / 2)");
  TORCH_CHECK_VALUE(t.device() == x.device(), name, " is on ", t.device(), " but x is on ",
                    x.device(), ": they must be on one device");
}

// The names the fused call takes, each with what it means (the error lists them): the one
// definition, which Python reads as `_C.NORMS` and `_C.ROPE_STYLES`.
struct Choice {
  const char* name;
  const char* meaning;
};
constexpr std::array<Choice, 2> kNorms = {{
    {"all_heads", "Wan: the mean over every head of a token"},
    {"per_head", "HunyuanVideo: the mean over each head"},
}};
constexpr std::array<Choice, 2> kRopeStyles = {{
    {"interleaved", "pairs 2i, 2i+1"},
    {"half", "rotate-half: pairs i, i + d/2"},
}};

void check_choice(const char* argument, const std::string& value,
                  const std::array<Choice, 2>& choices) {
  for (const Choice& choice : choices)
    if (value == choice.name) return;
  std::ostringstream rule;
  for (size_t i = 0; i < choices.size(); ++i)
    rule << (i == 0 ? "" : " or ") << "'" << choices[i].name << "' (" << choices[i].meaning << ")";
  TORCH_CHECK_VALUE(false, argument, "='", value, "': must be ", rule.str());
}

std::vector<std::string> names(const std::array<Choice, 2>& choices) {
  std::vector<std::string> out;
  for (const Choice& choice : choices) out.emplace_back(choice.name);
  return out;
}

}  // namespace

std::tuple<std::vector<std::string>, std::vector<std::string>> norm_rope_choices_op() {
  return {names(kNorms), names(kRopeStyles)};
}

kernels::NormRopeArgs check_norm_rope(const at::Tensor& x, const at::Tensor& norm_weight,
                                      double eps, const at::Tensor& cos, const at::Tensor& sin,
                                      const std::string& norm, const std::string& rope_style,
                                      const std::string& layout) {
  checked_element_size(x);  // 4-d, a supported element size (any strides: see the header)
  TORCH_CHECK_VALUE(layout == "bshd" || layout == "sbhd", "layout='", layout,
                    "': the fused norm + RoPE scatter takes 'bshd' or 'sbhd'");
  kernels::NormRopeArgs args;
  switch (x.scalar_type()) {
    case at::kBFloat16:
      args.type = kernels::ElementType::kBFloat16;
      break;
    case at::kHalf:
      args.type = kernels::ElementType::kFloat16;
      break;
    case at::kFloat:
      args.type = kernels::ElementType::kFloat32;
      break;
    default:
      TORCH_CHECK_VALUE(false, "x has dtype ", x.scalar_type(),
                        ": the fused norm + RoPE "
                        "scatter takes bfloat16, float16 or float32");
  }
  check_choice("norm", norm, kNorms);
  check_choice("rope_style", rope_style, kRopeStyles);
  TORCH_CHECK_VALUE(std::isfinite(eps) && eps > 0, "eps=", eps, ": must be a finite number > 0");
  args.sbhd = layout == "sbhd";
  args.s_local = x.size(args.sbhd ? 0 : 1);
  args.batch = x.size(args.sbhd ? 1 : 0);
  args.heads = x.size(2);
  args.head_dim = x.size(3);
  TORCH_CHECK_VALUE(args.head_dim % 2 == 0, "x has head_dim ", args.head_dim,
                    ": RoPE rotates pairs, so head_dim must be even");
  args.per_head = norm == kNorms[1].name;
  args.half_style = rope_style == kRopeStyles[1].name;
  args.eps = static_cast<float>(eps);
  const int64_t weights = args.per_head ? args.head_dim : args.heads * args.head_dim;
  TORCH_CHECK_VALUE(norm_weight.scalar_type() == at::kFloat && norm_weight.dim() == 1 &&
                        norm_weight.numel() == weights && norm_weight.is_contiguous(),
                    "norm_weight has shape ", dims(norm_weight.sizes()), " and dtype ",
                    norm_weight.scalar_type(), ": norm='", norm,
                    "' needs a contiguous float32 "
                    "tensor of shape [",
                    weights, "] (", args.per_head ? "head_dim" : "heads * head_dim", ")");
  TORCH_CHECK_VALUE(norm_weight.device() == x.device(), "norm_weight is on ", norm_weight.device(),
                    " but x is on ", x.device(), ": they must be on one device");
  check_table("cos", cos, x, args.s_local, args.head_dim / 2);
  check_table("sin", sin, x, args.s_local, args.head_dim / 2);
  return args;
}

void check_norm_rope_op(const at::Tensor& x, const at::Tensor& norm_weight, double eps,
                        const at::Tensor& cos, const at::Tensor& sin, std::string norm,
                        std::string rope_style, std::string layout) {
  check_norm_rope(x, norm_weight, eps, cos, sin, norm, rope_style, layout);
}

at::Tensor qk_norm_rope_meta(const at::Tensor& x FU_FUSED_ARGS(FU_UNUSED_PARAM)) {
  check_norm_rope(x, norm_weight, eps, cos, sin, norm, rope_style, layout);
  return all_to_all_meta(x, 0, tag, group_name, seq_splits, head_splits, layout, rank);
}

}  // namespace fast_ulysses::ops
