#include "ops/plan_ops.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <array>

#include "ops/group_key.h"
#include "ops/plan_errors.h"
#include "plan/host_executor.h"
#include "plan/tag_rules.h"

namespace fast_ulysses::ops {
namespace {

std::optional<std::vector<int64_t>> to_vector(const std::optional<at::IntArrayRef>& values) {
  if (!values) return std::nullopt;
  return values->vec();
}

// The columns of a descriptor row (the plan op's output, host_copy's input), in order: the one
// definition of that order. Column 0 is the peer; the others are CopyDescriptor's byte fields.
constexpr std::array<int64_t CopyDescriptor::*, kDescriptorFields - 1> kByteFields = {
    &CopyDescriptor::src_offset,     &CopyDescriptor::dst_offset,
    &CopyDescriptor::width,          &CopyDescriptor::height,
    &CopyDescriptor::depth,          &CopyDescriptor::src_pitch,
    &CopyDescriptor::dst_pitch,      &CopyDescriptor::src_slice_pitch,
    &CopyDescriptor::dst_slice_pitch};
const std::array<std::string, kDescriptorFields> kFieldNames = {
    "peer",  "src_offset", "dst_offset", "width",           "height",
    "depth", "src_pitch",  "dst_pitch",  "src_slice_pitch", "dst_slice_pitch"};

CopyDescriptor descriptor_from(at::IntArrayRef row) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(row.size()) == kDescriptorFields, "descriptor has ",
                    row.size(), " fields: it needs ", kDescriptorFields);
  CopyDescriptor c;
  c.peer = static_cast<int>(row[0]);
  for (size_t f = 0; f < kByteFields.size(); ++f) c.*kByteFields[f] = row[f + 1];
  return c;
}

at::Tensor meta_output(const at::Tensor& x, int64_t mode, const std::string& group_name,
                       const std::optional<at::IntArrayRef>& seq_splits,
                       const std::optional<at::IntArrayRef>& head_splits, const std::string& layout,
                       std::optional<int64_t> rank) {
  auto group = c10d::resolve_process_group(process_group_name(group_name));
  const Plan plan = plan_for(group->getSize(), collective_rank(group_name, rank), mode, x.sizes(),
                             checked_element_size(x), seq_splits, head_splits, layout);
  return at::empty(std::vector<int64_t>(plan.output_shape.begin(), plan.output_shape.end()),
                   x.options());
}

}  // namespace

int64_t checked_element_size(const at::Tensor& x) {
  TORCH_CHECK_VALUE(x.dim() == 4, "x has shape ", x.sizes(),
                    ": it must be 4-d (bshd, sbhd or bhsd)");
  const auto dtype = x.scalar_type();
  TORCH_CHECK_VALUE(!at::isComplexType(dtype) && dtype != at::kBool, "x has dtype ", dtype,
                    ": complex and bool tensors are not supported");
  const int64_t es = static_cast<int64_t>(x.element_size());
  TORCH_CHECK_VALUE(es == 1 || es == 2 || es == 4, "x has dtype ", dtype, " of ", es,
                    " bytes: element size must be 1, 2 or 4 bytes (float16 and bfloat16 are "
                    "the main ones)");
  return es;
}

void check_borrowed_grad(const at::Tensor& x, const std::string& entry) {
  TORCH_CHECK_VALUE(!(x.requires_grad() && c10::GradMode::is_enabled()), entry,
                    ": x requires grad, but a borrowed result is the tag's receive window, "
                    "overwritten by the next call on the tag while autograd may still need it; "
                    "call all_to_all_single_4d (an owned result) when gradients are needed, or "
                    "run under torch.no_grad()");
}

std::tuple<std::vector<int64_t>, std::vector<int64_t>> shapes_op(
    int64_t world_size, int64_t rank, int64_t mode, int64_t batch, int64_t head_dim,
    std::vector<int64_t> seq_splits, std::vector<int64_t> head_splits, std::string layout) {
  return translate_plan_errors([&] {
    check_world_size_and_rank(world_size, rank);  // before narrowing to int
    PlanRequest request;
    request.world_size = static_cast<int>(world_size);
    request.rank = static_cast<int>(rank);
    request.mode = parse_mode(mode);
    request.layout = parse_layout(layout);
    request.batch = batch;
    request.head_dim = head_dim;
    request.element_size = 1;  // shapes do not depend on it
    request.seq_splits = std::move(seq_splits);
    request.head_splits = std::move(head_splits);
    const Plan plan = make_plan(request);
    return std::tuple<std::vector<int64_t>, std::vector<int64_t>>{
        std::vector<int64_t>(plan.input_shape.begin(), plan.input_shape.end()),
        std::vector<int64_t>(plan.output_shape.begin(), plan.output_shape.end())};
  });
}

void check_group_op(int64_t world_size, int64_t rank) {
  translate_plan_errors([&] {
    check_world_size_and_rank(world_size, rank);
    return 0;
  });
}

std::vector<std::string> layouts_op() {
  std::vector<std::string> names;
  for (Layout layout : kLayouts) names.emplace_back(layout_name(layout));
  return names;
}

std::tuple<std::vector<std::string>, std::vector<int64_t>> limits_op() {
  return {{"max_world_size", "max_bytes", "copy_engine_alignment", "max_tags"},
          {kMaxWorldSize, kMaxBytes, kCopyEngineAlignment, kMaxTags}};
}

void check_tag_use_op(std::string tag, int64_t tags_so_far, bool known, bool deferred) {
  translate_plan_errors([&] {
    check_tag_use(tag, tags_so_far, known, deferred);
    return 0;
  });
}

int64_t window_for_call_op(std::string tag, int64_t bytes, int64_t held_bytes, bool sealed) {
  return translate_plan_errors([&] { return window_for_call(tag, bytes, held_bytes, sealed); });
}

Plan plan_for(int64_t world_size, int64_t rank, int64_t mode, at::IntArrayRef shape,
              int64_t element_size, const std::optional<at::IntArrayRef>& seq_splits,
              const std::optional<at::IntArrayRef>& head_splits, const std::string& layout,
              at::IntArrayRef strides) {
  return translate_plan_errors([&] {
    check_world_size_and_rank(world_size, rank);  // before narrowing to int
    const PlanRequest request =
        request_from_shape(static_cast<int>(world_size), static_cast<int>(rank), parse_mode(mode),
                           parse_layout(layout), shape.vec(), element_size, to_vector(seq_splits),
                           to_vector(head_splits));
    if (strides.empty()) return make_plan(request);
    return make_plan(request, Strides{strides[0], strides[1], strides[2], strides[3]});
  });
}

InputForm input_form(const at::Tensor& x, const std::string& layout) {
  if (x.is_contiguous()) return InputForm::kContiguous;  // (the per-call path: one flag)
  return translate_plan_errors([&] {
    const at::IntArrayRef n = x.sizes(), st = x.strides();
    const bool regular =
        regular_input_strides(parse_layout(layout), Shape4{n[0], n[1], n[2], n[3]},
                              Strides{st[0], st[1], st[2], st[3]}, x.element_size());
    return regular ? InputForm::kStrided : InputForm::kCopy;
  });
}

std::tuple<at::Tensor, std::vector<int64_t>, std::vector<int64_t>, std::vector<int64_t>, int64_t>
plan_op(int64_t world_size, int64_t rank, int64_t mode, at::IntArrayRef shape, int64_t element_size,
        std::optional<at::IntArrayRef> seq_splits, std::optional<at::IntArrayRef> head_splits,
        std::string layout) {
  const Plan plan =
      plan_for(world_size, rank, mode, shape, element_size, seq_splits, head_splits, layout);
  const int64_t P = static_cast<int64_t>(plan.copies.size());
  at::Tensor rows = at::empty({P, kDescriptorFields}, at::kLong);
  auto out = rows.accessor<int64_t, 2>();
  for (int64_t j = 0; j < P; ++j) {
    const CopyDescriptor& c = plan.copies[j];
    out[j][0] = c.peer;
    for (size_t f = 0; f < kByteFields.size(); ++f) out[j][f + 1] = c.*kByteFields[f];
  }
  return {rows, std::vector<int64_t>(plan.output_shape.begin(), plan.output_shape.end()),
          plan.request.seq_splits, plan.request.head_splits, plan.window_bytes};
}

std::vector<std::string> descriptor_fields() {
  return {kFieldNames.begin(), kFieldNames.end()};
}

void host_copy(const at::Tensor& src, const at::Tensor& dst, at::IntArrayRef descriptor) {
  TORCH_CHECK_VALUE(src.is_cpu() && dst.is_cpu(), "host_copy runs on CPU tensors");
  TORCH_CHECK_VALUE(src.is_contiguous() && dst.is_contiguous(),
                    "host_copy needs contiguous src and dst");
  const CopyDescriptor copy = descriptor_from(descriptor);
  translate_plan_errors([&] {
    execute_on_host(copy, static_cast<const std::byte*>(src.const_data_ptr()), src.nbytes(),
                    static_cast<std::byte*>(dst.data_ptr()), dst.nbytes());
    return 0;
  });
}

at::Tensor all_to_all_meta(const at::Tensor& x FU_OWNED_ARGS(FU_UNUSED_PARAM)) {
  return meta_output(x, mode, group_name, seq_splits, head_splits, layout, rank);
}

at::Tensor all_to_all_borrowed_meta(const at::Tensor& x FU_BORROWED_ARGS(FU_UNUSED_PARAM)) {
  return meta_output(x, mode, group_name, seq_splits, head_splits, layout, rank);
}

at::Tensor& all_to_all_out_meta(const at::Tensor& x FU_OWNED_ARGS(FU_UNUSED_PARAM),
                                at::Tensor& out) {
  const at::Tensor expected =
      meta_output(x, mode, group_name, seq_splits, head_splits, layout, rank);
  TORCH_CHECK_VALUE(out.scalar_type() == x.scalar_type(), "out has dtype ", out.scalar_type(),
                    " but x has ", x.scalar_type(), ": out must have x's dtype");
  TORCH_CHECK_VALUE(out.sizes() == expected.sizes(), "out has shape ", out.sizes(),
                    " but the call's output is ", expected.sizes(),
                    ": out must have the output's shape");
  TORCH_CHECK_VALUE(out.is_contiguous(),
                    "out is not contiguous: out must be a contiguous "
                    "tensor");
  return out;
}

int64_t collective_rank(const std::string& group_name, std::optional<int64_t> rank) {
  const int64_t actual = c10d::resolve_process_group(process_group_name(group_name))->getRank();
  check_rank(group_name, rank, actual);
  return actual;
}

void check_rank(const std::string& group_name, std::optional<int64_t> rank, int64_t actual) {
  TORCH_CHECK_VALUE(!rank || *rank == actual, "rank=", *rank, " but this process is rank ", actual,
                    " of process group '", group_name, "': pass the process's own rank (or None)");
}

}  // namespace fast_ulysses::ops
