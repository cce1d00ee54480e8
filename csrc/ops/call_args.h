// The collectives' arguments, defined once. Each list is an X-macro: X(kernel type, name,
// schema text), in schema order, after the input tensor `x` (always first: `const at::Tensor& x`,
// "Tensor x"). The schemas (schemas.cpp), the CUDA kernels (cuda_ops.cpp), the Meta kernels
// (plan_ops.h, norm_rope_ops.h), the typed entry (fast_entry.cpp) and the names Python's
// autograd unpacks by (`fast_ulysses._C.OWNED_ARGUMENTS`, module_c.cpp) are all made from them.
// Header-only and free of torch: a type is only spelled here, never used.
#pragma once

// all_to_all_single_4d (and all_to_all_single_4d_out, which adds `*, Tensor(a!) out` after
// these). `rank` makes the output shape a function of the arguments alone (see schemas.cpp).
#define FU_OWNED_ARGS(X)                                                    \
  X(int64_t, mode, "int mode")                                              \
  X(std::string, tag, "str tag")                                            \
  X(std::string, group_name, "str group_name")                              \
  X(std::optional<at::IntArrayRef>, seq_splits, "int[]? seq_splits=None")   \
  X(std::optional<at::IntArrayRef>, head_splits, "int[]? head_splits=None") \
  X(std::string, layout, "str layout='bshd'")                               \
  X(std::optional<int64_t>, rank, "int? rank=None")

// all_to_all_single_4d_borrowed: the owned call's arguments with `barrier` before the rank.
#define FU_BORROWED_ARGS(X)                                                 \
  X(int64_t, mode, "int mode")                                              \
  X(std::string, tag, "str tag")                                            \
  X(std::string, group_name, "str group_name")                              \
  X(std::optional<at::IntArrayRef>, seq_splits, "int[]? seq_splits=None")   \
  X(std::optional<at::IntArrayRef>, head_splits, "int[]? head_splits=None") \
  X(std::string, layout, "str layout='bshd'")                               \
  X(bool, barrier, "bool barrier=True")                                     \
  X(std::optional<int64_t>, rank, "int? rank=None")

// qk_norm_rope_all_to_all (the fused op: mode 0 of x after the norm and the rotation).
#define FU_FUSED_ARGS(X)                                                    \
  X(std::string, tag, "str tag")                                            \
  X(std::string, group_name, "str group_name")                              \
  X(const at::Tensor&, norm_weight, "Tensor norm_weight")                   \
  X(double, eps, "float eps")                                               \
  X(const at::Tensor&, cos, "Tensor cos")                                   \
  X(const at::Tensor&, sin, "Tensor sin")                                   \
  X(std::string, norm, "str norm='all_heads'")                              \
  X(std::string, rope_style, "str rope_style='interleaved'")                \
  X(std::optional<at::IntArrayRef>, seq_splits, "int[]? seq_splits=None")   \
  X(std::optional<at::IntArrayRef>, head_splits, "int[]? head_splits=None") \
  X(std::string, layout, "str layout='bshd'")                               \
  X(bool, borrowed, "bool borrowed=False")                                  \
  X(bool, barrier, "bool barrier=True")                                     \
  X(std::optional<int64_t>, rank, "int? rank=None")

// What a list makes, written after `x`: `f(const at::Tensor& x FU_OWNED_ARGS(FU_PARAM))`.
#define FU_SCHEMA(type, name, schema) ", " schema  // "Tensor x" FU_..._ARGS(...)
#define FU_PARAM(type, name, schema) , type name   // a kernel's parameters
#define FU_UNUSED_PARAM(type, name, schema) , [[maybe_unused]] type name  // a Meta kernel's
#define FU_TYPE(type, name, schema) , type        // a typed call's signature
#define FU_ARG(type, name, schema) , name         // passing them on
#define FU_NAME(type, name, schema) , #name       // {"x" FU_..._ARGS(FU_NAME)}
#define FU_LISTED(type, name, schema) ", " #name  // "f(x" ..._ARGS(FU_LISTED) ")"
#define FU_COUNT(type, name, schema) +1           // 1 FU_..._ARGS(FU_COUNT)
