// Torch-facing wrappers of the plan: argument conversion and error translation only.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ops/call_args.h"
#include "plan/plan.h"

namespace fast_ulysses::ops {

// Builds the plan for this rank's input, turning PlanError into a c10::ValueError
// (Python ValueError) that carries the plan's message unchanged. `strides` (x's, regular: see
// input_form) make the copies read x through them; empty, x is read as a dense tensor.
Plan plan_for(int64_t world_size, int64_t rank, int64_t mode, at::IntArrayRef shape,
              int64_t element_size, const std::optional<at::IntArrayRef>& seq_splits,
              const std::optional<at::IntArrayRef>& head_splits, const std::string& layout,
              at::IntArrayRef strides = {});

// How a call's copies read x, by plan.h's source rule (regular_input_strides, the one place it
// lives): kContiguous, x as a dense tensor; kStrided, a regular strided view (a packed
// projection's q, k or v) read through x's strides as it stands; kCopy, any other strides: the
// op copies x once with .contiguous() and moves the copy. x must be 4-d (checked_element_size);
// a bad layout raises the plan's ValueError.
enum class InputForm { kContiguous, kStrided, kCopy };
InputForm input_form(const at::Tensor& x, const std::string& layout);

// Descriptor rows are int64 [P, 10] CPU tensors; descriptor_fields() names the columns in order
// (`_C.DESCRIPTOR_FIELDS`: Python builds its CopyDescriptor by these names).
constexpr int64_t kDescriptorFields = 10;
std::vector<std::string> descriptor_fields();

std::tuple<at::Tensor, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, int64_t>
plan_op(int64_t world_size, int64_t rank, int64_t mode, at::IntArrayRef shape, int64_t element_size,
        std::optional<at::IntArrayRef> seq_splits, std::optional<at::IntArrayRef> head_splits,
        std::string layout);

void host_copy(const at::Tensor& src, const at::Tensor& dst, at::IntArrayRef descriptor);

// The plan's rule for a group's size and rank (ValueError with the plan's message):
// `_C.check_group`.
void check_group_op(int64_t world_size, int64_t rank);
// plan/tag_rules.h for the torch fallback (ValueError with the rule's message):
// `_C.check_tag_use` and `_C.window_for_call`.
void check_tag_use_op(std::string tag, int64_t tags_so_far, bool known, bool deferred);
int64_t window_for_call_op(std::string tag, int64_t bytes, int64_t held_bytes, bool sealed);

// The collectives' Meta kernels (their arguments: call_args.h): the plan's output shape.
at::Tensor all_to_all_meta(const at::Tensor& x FU_OWNED_ARGS(FU_PARAM));
at::Tensor all_to_all_borrowed_meta(const at::Tensor& x FU_BORROWED_ARGS(FU_PARAM));

// The out= op's Meta kernel: `out` itself, once its shape, dtype and contiguity match the call.
at::Tensor& all_to_all_out_meta(const at::Tensor& x FU_OWNED_ARGS(FU_PARAM), at::Tensor& out);

// The rank a collective runs as: `rank` when given (it must equal the process group's rank in
// `group_name`), else the group's rank.
int64_t collective_rank(const std::string& group_name, std::optional<int64_t> rank);
// Raises unless `rank` is unset or equals `actual`, this process's rank in `group_name`.
void check_rank(const std::string& group_name, std::optional<int64_t> rank, int64_t actual);

// Checks the input tensor's rules (4-d, a 1-, 2- or 4-byte dtype) and returns its element size;
// the device rule is the transport's. Any strides: a strided x moves as it stands or is copied
// once (input_form). Both groups (and reserve) ask it: the fast one in its kernels, the
// fallback through `_C.check_input`.
int64_t checked_element_size(const at::Tensor& x);

// The borrowed entry points' autograd rule: an input that requires grad, with grad mode on, is
// refused (ValueError naming `entry` and the owned call to use), because a borrowed result is
// the tag's receive window, overwritten by the next call on the tag while autograd may still
// need it. `_C.check_borrowed_grad`, and the borrowed op's Autograd kernel, ask it.
void check_borrowed_grad(const at::Tensor& x, const std::string& entry);

// `_C.shapes`: rank `rank`'s input and output shapes (layout order) for explicit splits,
// from the plan (make_plan's input_shape / output_shape), ValueError with the plan's message.
std::tuple<std::vector<int64_t>, std::vector<int64_t>> shapes_op(
    int64_t world_size, int64_t rank, int64_t mode, int64_t batch, int64_t head_dim,
    std::vector<int64_t> seq_splits, std::vector<int64_t> head_splits, std::string layout);

// `_C.LAYOUTS`: every layout name, in enum order (plan.h's kLayouts).
std::vector<std::string> layouts_op();

// `_C.LIMITS`: plan.h's limits by name, so Python reads the one definition.
std::tuple<std::vector<std::string>, std::vector<int64_t>> limits_op();

}  // namespace fast_ulysses::ops
