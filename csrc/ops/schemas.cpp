// The one place that declares every fast_ulysses op (one place declares, many implement).
// This library (fast_ulysses._C) also implements what needs no GPU: the plan, the host executor
// and the Meta kernels that let torch.compile trace the collectives. The CUDA kernels and the
// group-management ops are implemented in fast_ulysses._cuda (cuda_ops.cpp).
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include "env/env.h"
#include "ops/norm_rope_ops.h"
#include "ops/plan_ops.h"
#include "plan/group_stats.h"

TORCH_LIBRARY(fast_ulysses, m) {
  // GPU-free.
  m.def(
      "plan(int world_size, int rank, int mode, int[] shape, int element_size, "
      "int[]? seq_splits=None, int[]? head_splits=None, str layout='bshd') "
      "-> (Tensor descriptors, int[] output_shape, int[] seq_splits, int[] head_splits, "
      "int window_bytes)");
  m.def("host_copy(Tensor src, Tensor(a!) dst, int[] descriptor) -> ()");
  // The names of a descriptor row's columns, in order.
  m.def("descriptor_fields() -> str[]");
  // The input tensor's rules (4-d, contiguous, a 1-, 2- or 4-byte non-bool, non-complex dtype),
  // for every group: returns the element size or raises ValueError. Any device (Meta included).
  m.def("check_input(Tensor x) -> int");
  // The borrowed entry points' autograd rule: raises ValueError naming `entry` when x requires
  // grad with grad mode on (a borrowed result is overwritten by the tag's next call).
  m.def("check_borrowed_grad(Tensor x, str entry) -> ()");
  // Rank `rank`'s input and output shapes for explicit splits: what every caller that builds a
  // rank's input (tests, benchmarks, presets) asks instead of recomputing it.
  m.def(
      "shapes(int world_size, int rank, int mode, int batch, int head_dim, int[] seq_splits, "
      "int[] head_splits, str layout='bshd') -> (int[] input_shape, int[] output_shape)");
  // The plan's rule for a group (1 <= world_size <= max_world_size, 0 <= rank < world_size):
  // raises ValueError, for groups that check it before any call (TorchUlyssesGroup).
  m.def("check_group(int world_size, int rank) -> ()");
  // The per-tag rules of csrc/plan/tag_rules.h for the torch fallback (the transport applies
  // them itself): a new tag past max_tags, or a deferred tag before barrier(), raises
  // ValueError; window_for_call returns the bytes the tag's window holds after the call (-1 in:
  // none yet) and raises where a sealed pool has no room for it.
  m.def("check_tag_use(str tag, int tags_so_far, bool known, bool deferred) -> ()");
  m.def("window_for_call(str tag, int bytes, int held_bytes, bool sealed) -> int");
  // The environment switches of csrc/env/env.h (the one parser): the value of one 0|1 switch
  // (its default when unset or empty), and a check of every setting; both raise ValueError
  // naming the variable for a bad value.
  m.def("env_switch(str name) -> bool");
  m.def("check_env() -> ()");
  // Every layout name the plan takes, in enum order ("bshd", "sbhd", "bhsd").
  m.def("layouts() -> str[]");
  // The limits of csrc/plan/plan.h and tag_rules.h, by name (max_world_size, max_bytes,
  // copy_engine_alignment, max_tags).
  m.def("limits() -> (str[] names, int[] values)");

  // The collectives. `group_name` is the c10d name of the process group the UlyssesGroup was
  // built on (ProcessGroup.group_name). `rank` (this process's rank in it) makes the output
  // shape, which depends on the rank with uneven splits, a function of the arguments alone, so
  // a compiled graph cached by one rank is never reused by another with a different shape; when
  // given it must be the group's rank. The Python API always passes it.
  m.def(
      "all_to_all_single_4d(Tensor x, int mode, str tag, str group_name, "
      "int[]? seq_splits=None, int[]? head_splits=None, str layout='bshd', int? rank=None) "
      "-> Tensor");
  // The owned call into the caller's `out` (checked: device, dtype, shape, contiguity, no
  // overlap with x or the tag's window; ValueError before anything is sent). No autograd.
  m.def(
      "all_to_all_single_4d_out(Tensor x, int mode, str tag, str group_name, "
      "int[]? seq_splits=None, int[]? head_splits=None, str layout='bshd', int? rank=None, *, "
      "Tensor(a!) out) -> Tensor(a!)");
  m.def(
      "all_to_all_single_4d_borrowed(Tensor x, int mode, str tag, str group_name, "
      "int[]? seq_splits=None, int[]? head_splits=None, str layout='bshd', bool barrier=True, "
      "int? rank=None) -> Tensor");

  // Group management (implemented in _cuda). Collective: every rank calls them in the same order.
  m.def("create_group(str group_name, int device_index, int initial_pool_bytes) -> ()");
  m.def("reserve(str group_name, str[] tags, int[] window_bytes) -> ()");
  m.def("barrier(str group_name) -> ()");
  m.def("destroy_group(str group_name) -> ()");
  // The group's counters, named by group_stats_keys (below), for stats(), tests and doctor.
  m.def("group_stats(str group_name) -> (str[] names, int[] values)");
  // The keys of group_stats, in order (csrc/plan/group_stats.h): GPU-free, for the fallback.
  m.def("group_stats_keys() -> str[]");
  // The group's device rule, alone: FAST_ULYSSES_DEBUG checks it before the ranks agree.
  m.def("check_device(str group_name, Tensor x) -> ()");
  // With FAST_ULYSSES_HOST_PROFILE=1: host nanoseconds per stage of the calls since the last
  // read (stage names, sums, number of calls); resets them.
  m.def("host_profile(str group_name) -> (str[] stages, int[] nanoseconds, int calls)");

  // The fused QK RMSNorm + RoPE scatter (the opt-in SM path): mode 0 of x after the norm and
  // the rotation (csrc/kernels/norm_rope.h has the math), an owned or a borrowed result. Its
  // argument rules alone, for the fallback: check_norm_rope (GPU-free).
  m.def(
      "qk_norm_rope_all_to_all(Tensor x, str tag, str group_name, Tensor norm_weight, "
      "float eps, Tensor cos, Tensor sin, str norm='all_heads', str rope_style='interleaved', "
      "int[]? seq_splits=None, int[]? head_splits=None, str layout='bshd', "
      "bool borrowed=False, bool barrier=True, int? rank=None) -> Tensor");
  m.def(
      "check_norm_rope(Tensor x, Tensor norm_weight, float eps, Tensor cos, Tensor sin, "
      "str norm, str rope_style, str layout) -> ()");
  // The names norm= and rope_style= take (fast_ulysses.fused.NORMS and ROPE_STYLES read them).
  m.def("norm_rope_choices() -> (str[] norms, str[] rope_styles)");
}

TORCH_LIBRARY_IMPL(fast_ulysses, CPU, m) {
  m.impl("host_copy", &fast_ulysses::ops::host_copy);
}

namespace {

bool env_switch(std::string name) { return fast_ulysses::switch_value(name); }

std::vector<std::string> group_stats_keys() {
  return {fast_ulysses::kStatNames.begin(), fast_ulysses::kStatNames.end()};
}

}  // namespace

TORCH_LIBRARY_IMPL(fast_ulysses, CompositeExplicitAutograd, m) {
  m.impl("plan", &fast_ulysses::ops::plan_op);
  m.impl("descriptor_fields", &fast_ulysses::ops::descriptor_fields);
  m.impl("check_norm_rope", &fast_ulysses::ops::check_norm_rope_op);
  m.impl("norm_rope_choices", &fast_ulysses::ops::norm_rope_choices_op);
  m.impl("check_input", &fast_ulysses::ops::check_input_op);
  m.impl("check_borrowed_grad", &fast_ulysses::ops::check_borrowed_grad);
  m.impl("limits", &fast_ulysses::ops::limits_op);
  m.impl("layouts", &fast_ulysses::ops::layouts_op);
  m.impl("check_group", &fast_ulysses::ops::check_group_op);
  m.impl("check_tag_use", &fast_ulysses::ops::check_tag_use_op);
  m.impl("window_for_call", &fast_ulysses::ops::window_for_call_op);
  m.impl("shapes", &fast_ulysses::ops::shapes_op);
  m.impl("env_switch", &env_switch);
  m.impl("group_stats_keys", &group_stats_keys);
  m.impl("check_env", &fast_ulysses::check_env);
}

namespace {

// The borrowed op's Autograd kernel: applies the borrowed autograd rule to x before anything is
// sent, then runs the op below autograd (its result records no backward). In C++ so that a
// call of the op costs no Python (UlyssesGroup's borrowed method goes through it too).
void borrowed_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys,
                       torch::jit::Stack* stack) {
  const size_t arguments = op.schema().arguments().size();
  const c10::IValue& x = (*stack)[stack->size() - arguments];
  if (x.isTensor())
    fast_ulysses::ops::check_borrowed_grad(x.toTensor(), "all_to_all_single_4d_borrowed");
  at::AutoDispatchBelowAutograd guard;
  op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

}  // namespace

TORCH_LIBRARY_IMPL(fast_ulysses, Autograd, m) {
  m.impl("all_to_all_single_4d_borrowed",
         torch::CppFunction::makeFromBoxedFunction<&borrowed_autograd>());
}

TORCH_LIBRARY_IMPL(fast_ulysses, Meta, m) {
  m.impl("all_to_all_single_4d", &fast_ulysses::ops::all_to_all_meta);
  m.impl("all_to_all_single_4d_borrowed", &fast_ulysses::ops::all_to_all_borrowed_meta);
  m.impl("all_to_all_single_4d_out", &fast_ulysses::ops::all_to_all_out_meta);
  m.impl("qk_norm_rope_all_to_all", &fast_ulysses::ops::qk_norm_rope_meta);
}
