// The one place that declares every fast_ulysses op (one place declares, many implement). The
// ops are the collectives, the fused op, the group's lifecycle, the plan and the FP8 wire's
// passes: what moves data, holds state or is traced. Rules and constants Python only asks about
// are plain functions and attributes of the module (module_c.cpp).
// This library (fast_ulysses._C) also implements what needs no GPU: the plan, the host executor,
// the FP8 wire's CPU kernels and the Meta kernels that let torch.compile trace the collectives. The
// CUDA kernels and the group-management ops are implemented in fast_ulysses._cuda (cuda_ops.cpp).
#include <torch/library.h>

#include "ops/call_args.h"
#include "ops/norm_rope_ops.h"
#include "ops/plan_ops.h"
#include "ops/wire_ops.h"

TORCH_LIBRARY(fast_ulysses, m) {
  // GPU-free.
  m.def(
      "plan(int world_size, int rank, int mode, int[] shape, int element_size, "
      "int[]? seq_splits=None, int[]? head_splits=None, str layout='bshd') "
      "-> (Tensor descriptors, int[] output_shape, int[] seq_splits, int[] head_splits, "
      "int window_bytes)");
  m.def("host_copy(Tensor src, Tensor(a!) dst, int[] descriptor) -> ()");
  // The fused op's argument rules alone, for the fallback's unfused math (fused.py's
  // norm_rope_reference): an op, not a function of the module, because that math runs inside
  // torch.compile graphs, which trace an op (its CompositeExplicitAutograd kernel runs on fake
  // tensors) where they would break at a plain function. The other rules Python asks
  // (check_input, the tag rules, the limits, ...) are functions and constants of the module
  // (module_c.cpp): no traced code calls them.
  m.def(
      "check_norm_rope(Tensor x, Tensor norm_weight, float eps, Tensor cos, Tensor sin, "
      "str norm, str rope_style, str layout) -> ()");

  // The collectives. `group_name` is the UlyssesGroup's key (ops/group_key.h): the c10d name of
  // the process group it was built on (ProcessGroup.group_name), suffixed when another group of
  // the process lives on the same process group. `rank` (this process's rank in it) makes the
  // output shape, which depends on the rank with uneven splits, a function of the arguments alone,
  // so a compiled graph cached by one rank is never reused by another with a different shape; when
  // given it must be the group's rank. The Python API always passes it.
  // Their arguments: call_args.h.
  m.def("all_to_all_single_4d(Tensor x" FU_OWNED_ARGS(FU_SCHEMA) ") -> Tensor");
  // The owned call into the caller's `out` (checked: device, dtype, shape, contiguity, no
  // overlap with x or the tag's window; ValueError before anything is sent). No autograd.
  m.def("all_to_all_single_4d_out(Tensor x" FU_OWNED_ARGS(FU_SCHEMA) ", *, Tensor(a!) out) "
        "-> Tensor(a!)");
  m.def("all_to_all_single_4d_borrowed(Tensor x" FU_BORROWED_ARGS(FU_SCHEMA) ") -> Tensor");

  // Group management (implemented in _cuda). Collective: every rank calls them in the same order.
  // create_group returns the group's key (ops/group_key.h): the `group_name` of every later op.
  m.def("create_group(str group_name, int device_index, int initial_pool_bytes) -> str");
  m.def("reserve(str group_name, str[] tags, int[] window_bytes) -> ()");
  m.def("barrier(str group_name) -> ()");
  m.def("destroy_group(str group_name) -> ()");
  // Not collective: a group dropped without destroy() (ops/cuda_ops.cpp says what it waits for).
  m.def("forget_group(str group_name) -> ()");
  // The group's counters, by name (csrc/plan/group_stats.h), for stats(), tests and doctor.
  m.def("group_stats(str group_name) -> (str[] names, int[] values)");
  // The group's device rule, alone: FAST_ULYSSES_DEBUG checks it before the ranks agree.
  m.def("check_device(str group_name, Tensor x) -> ()");
  // With FAST_ULYSSES_HOST_PROFILE=1: host nanoseconds per stage of the calls since the last
  // read (stage names, sums, number of calls); resets them.
  m.def("host_profile(str group_name) -> (str[] stages, int[] nanoseconds, int calls)");

  // The fused QK RMSNorm + RoPE scatter (the opt-in SM path): mode 0 of x after the norm and
  // the rotation (csrc/kernels/norm_rope.h has the math), an owned or a borrowed result. Its
  // argument rules alone, for the fallback: check_norm_rope (above).
  m.def("qk_norm_rope_all_to_all(Tensor x" FU_FUSED_ARGS(FU_SCHEMA) ") -> Tensor");

  // FP8 on the wire (python/fast_ulysses/wire.py states the rule; csrc/kernels/wire_rule.h runs
  // it): x's rows quantized and packed (d payload values, then the float32 scale's 4 bytes),
  // and back, one pass each. CPU and Meta kernels (wire_ops.cpp).
  m.def("wire_quantize(Tensor x, ScalarType wire_dtype) -> Tensor");
  m.def("wire_dequantize(Tensor packed, ScalarType dtype) -> Tensor");
  m.def("wire_dequantize_out(Tensor packed, *, Tensor(a!) out) -> Tensor(a!)");
}

TORCH_LIBRARY_IMPL(fast_ulysses, CPU, m) {
  m.impl("host_copy", &fast_ulysses::ops::host_copy);
  m.impl("wire_quantize", &fast_ulysses::ops::wire_quantize_cpu);
  m.impl("wire_dequantize", &fast_ulysses::ops::wire_dequantize_cpu);
  m.impl("wire_dequantize_out", &fast_ulysses::ops::wire_dequantize_out_cpu);
}

TORCH_LIBRARY_IMPL(fast_ulysses, CompositeExplicitAutograd, m) {
  m.impl("plan", &fast_ulysses::ops::plan_op);
  m.impl("check_norm_rope", &fast_ulysses::ops::check_norm_rope_op);
}

// The collectives' Autograd kernels: autograd_kernels.cpp.
TORCH_LIBRARY_IMPL(fast_ulysses, Meta, m) {
  m.impl("all_to_all_single_4d", &fast_ulysses::ops::all_to_all_meta);
  m.impl("all_to_all_single_4d_borrowed", &fast_ulysses::ops::all_to_all_borrowed_meta);
  m.impl("all_to_all_single_4d_out", &fast_ulysses::ops::all_to_all_out_meta);
  m.impl("qk_norm_rope_all_to_all", &fast_ulysses::ops::qk_norm_rope_meta);
  m.impl("wire_quantize", &fast_ulysses::ops::wire_quantize_meta);
  m.impl("wire_dequantize", &fast_ulysses::ops::wire_dequantize_meta);
  m.impl("wire_dequantize_out", &fast_ulysses::ops::wire_dequantize_out_meta);
}
