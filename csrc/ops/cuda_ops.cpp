// CUDA implementations of the collectives and the group-management ops declared in
// schemas.cpp. The groups live in a registry keyed by each group's key (group_key.h: the c10d
// group name, suffixed for a second group on one process group), which is how the ops (and
// torch.compile graphs) refer to them.
#include <ATen/ATen.h>
#include <c10/util/MaybeOwned.h>
#include <torch/library.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <memory>
#include <mutex>
#include <unordered_map>

#include "ops/call_args.h"
#include "ops/group_key.h"
#include "ops/norm_rope_ops.h"
#include "ops/plan_ops.h"
#include "transport/ulysses_group.h"

namespace fast_ulysses::ops {
namespace {

using transport::Result;
using transport::UlyssesGroup;

std::mutex registry_mutex;
std::unordered_map<std::string, std::shared_ptr<UlyssesGroup>>& registry() {
  static std::unordered_map<std::string, std::shared_ptr<UlyssesGroup>> groups;
  return groups;
}

std::shared_ptr<UlyssesGroup> find_group(const std::string& group_name) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto found = registry().find(group_name);
  TORCH_CHECK_VALUE(found != registry().end(), "no UlyssesGroup for process group '", group_name,
                    "': it was never created or has been destroyed");
  return found->second;
}

// Every argument the plan depends on, flattened: the plan cache's key. `strides` are x's when
// the plan reads x through them (a regular strided view), else empty: a contiguous x's key has
// none, and every field before them is length-prefixed, so the two kinds of key never collide.
std::vector<int64_t> plan_key(int64_t mode, at::IntArrayRef shape, int64_t element_size,
                              const std::optional<at::IntArrayRef>& seq_splits,
                              const std::optional<at::IntArrayRef>& head_splits,
                              const std::string& layout, at::IntArrayRef strides) {
  std::vector<int64_t> key = {mode, element_size, static_cast<int64_t>(shape.size())};
  key.insert(key.end(), shape.begin(), shape.end());
  for (const auto& splits : {seq_splits, head_splits}) {
    key.push_back(splits ? static_cast<int64_t>(splits->size()) : -1);
    if (splits) key.insert(key.end(), splits->begin(), splits->end());
  }
  key.push_back(static_cast<int64_t>(layout.size()));
  key.insert(key.end(), layout.begin(), layout.end());
  key.insert(key.end(), strides.begin(), strides.end());
  return key;
}

// Every call's prologue, in this order: the group, the rank, the device rule (first: a tensor
// elsewhere is refused for that, whatever its shape), the caller's own checks of x (`check`,
// returning the element size), then the plan from the group's cache, and the tensor the copies
// read (`source`): x itself, contiguous or a regular strided view (read through its strides:
// plan.h's rule), or, for any other strides, x.contiguous(), one copy on the caller's stream
// made only once the plan is known good; the transport holds it like any input.
struct Prepared {
  std::shared_ptr<UlyssesGroup> group;
  const Plan* plan;
  c10::MaybeOwned<at::Tensor> source;
};

template <typename Check>  // int64_t(): a lambda, not a std::function (the per-call host path)
Prepared prepare(const at::Tensor& x, int64_t mode, const std::string& group_name,
                 const std::optional<at::IntArrayRef>& seq_splits,
                 const std::optional<at::IntArrayRef>& head_splits, const std::string& layout,
                 std::optional<int64_t> rank, Check&& check) {
  auto group = find_group(group_name);
  group->profile().start();
  check_rank(group_name, rank, group->rank());
  group->check_device(x);
  const int64_t element_size = check();
  const InputForm form = input_form(x, layout);
  const at::IntArrayRef strides = form == InputForm::kStrided ? x.strides() : at::IntArrayRef();
  const Plan& plan = group->plan(
      plan_key(mode, x.sizes(), element_size, seq_splits, head_splits, layout, strides), [&] {
        return plan_for(group->world_size(), group->rank(), mode, x.sizes(), element_size,
                        seq_splits, head_splits, layout, strides);
      });
  auto source = form == InputForm::kCopy ? c10::MaybeOwned<at::Tensor>::owned(x.contiguous())
                                         : c10::MaybeOwned<at::Tensor>::borrowed(x);
  group->profile().mark(transport::Stage::kPlan);
  return {std::move(group), &plan, std::move(source)};
}

at::Tensor run(const at::Tensor& x, int64_t mode, const std::string& tag,
               const std::string& group_name, const std::optional<at::IntArrayRef>& seq_splits,
               const std::optional<at::IntArrayRef>& head_splits, const std::string& layout,
               Result result, bool barrier, std::optional<int64_t> rank,
               const at::Tensor& out = at::Tensor()) {
  auto [group, plan, source] = prepare(x, mode, group_name, seq_splits, head_splits, layout, rank,
                                       [&] { return checked_element_size(x); });
  return group->all_to_all(*source, *plan, tag, result, barrier, nullptr, out);
}

// The kernels (their arguments: call_args.h).
at::Tensor all_to_all_cuda(const at::Tensor& x FU_OWNED_ARGS(FU_PARAM)) {
  return run(x, mode, tag, group_name, seq_splits, head_splits, layout, Result::kOwned, true, rank);
}

at::Tensor& all_to_all_out_cuda(const at::Tensor& x FU_OWNED_ARGS(FU_PARAM), at::Tensor& out) {
  run(x, mode, tag, group_name, seq_splits, head_splits, layout, Result::kOwned, true, rank, out);
  return out;
}

at::Tensor all_to_all_borrowed_cuda(const at::Tensor& x FU_BORROWED_ARGS(FU_PARAM)) {
  return run(x, mode, tag, group_name, seq_splits, head_splits, layout, Result::kBorrowed, barrier,
             rank);
}

// The fused QK RMSNorm + RoPE scatter: the mode-0 call's plan and windows, one kernel in place
// of the copies. The kernel reads x dense, so a strided x (a packed projection's q or k) is copied
// once with .contiguous() first: callers never see a refusal for it (x_arg contiguous: no copy).
at::Tensor qk_norm_rope_cuda(const at::Tensor& x_arg FU_FUSED_ARGS(FU_PARAM)) {
  const c10::MaybeOwned<at::Tensor> dense = x_arg.expect_contiguous();
  const at::Tensor& x = *dense;
  transport::FusedNormRope fused;
  auto [group, plan, source] =
      prepare(x, 0, group_name, seq_splits, head_splits, layout, rank, [&] {
        fused = {check_norm_rope(x, norm_weight, eps, cos, sin, norm, rope_style, layout),
                 {norm_weight, cos, sin}};
        return static_cast<int64_t>(x.element_size());
      });
  const auto& seq = plan->request.seq_splits;
  const auto& heads = plan->request.head_splits;
  fused.args.x = x.const_data_ptr();
  fused.args.weight = norm_weight.const_data_ptr<float>();
  fused.args.cos = cos.const_data_ptr<float>();
  fused.args.sin = sin.const_data_ptr<float>();
  fused.args.peers = group->world_size();
  for (int j = 0; j < group->world_size(); ++j) {
    fused.args.head_start[j + 1] = fused.args.head_start[j] + heads[j];
    if (j < group->rank()) fused.args.seq_offset += seq[j];
    fused.args.seq_total += seq[j];
  }
  return group->all_to_all(*source, *plan, tag, borrowed ? Result::kBorrowed : Result::kOwned,
                           borrowed ? barrier : true, &fused);
}

// Builds a group on the process group `group_name` and returns its key (group_key.h): the name
// itself while no other group of this process lives on it, else the name with a numbered suffix.
std::string create_group(std::string group_name, int64_t device_index, int64_t initial_pool_bytes) {
  static int64_t built = 0;  // numbers the suffixed keys (never reused in a process)
  std::string key = group_name;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    if (registry().count(key)) key = group_name + kGroupKeySuffix + std::to_string(++built);
  }
  auto group = std::make_shared<UlyssesGroup>(
      group_name, c10::Device(c10::DeviceType::CUDA, static_cast<int>(device_index)),
      initial_pool_bytes);
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().emplace(key, std::move(group));
  return key;
}

void reserve(std::string group_name, std::vector<std::string> tags,
             std::vector<int64_t> window_bytes) {
  find_group(group_name)->reserve(tags, window_bytes);
}

void barrier(std::string group_name) {
  find_group(group_name)->barrier();
}

void destroy_group(std::string group_name) {
  auto group = find_group(group_name);
  group->quiesce();
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().erase(group_name);
}

// A group dropped without destroy() (its Python object collected): not collective, so nothing
// waits for peers. This rank's work on the group is drained first, then the registry lets go (the
// windows are freed once calls still holding the group are done). A key not registered: nothing.
void forget_group(std::string group_name) {
  std::shared_ptr<UlyssesGroup> group;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto found = registry().find(group_name);
    if (found == registry().end()) return;
    group = found->second;
  }
  const auto erase = [&] {
    std::lock_guard<std::mutex> lock(registry_mutex);
    registry().erase(group_name);
  };  // (the group itself dies with `group`, outside the lock)
  try {
    group->drain();
  } catch (...) {
    erase();  // a key never freed would hold its windows for good
    throw;
  }
  erase();
}

std::tuple<std::vector<std::string>, std::vector<int64_t>> group_stats(std::string group_name) {
  std::tuple<std::vector<std::string>, std::vector<int64_t>> named;
  for (auto& [name, value] : find_group(group_name)->stats()) {
    std::get<0>(named).push_back(name);
    std::get<1>(named).push_back(value);
  }
  return named;
}

void check_device(std::string group_name, const at::Tensor& x) {
  find_group(group_name)->check_device(x);
}

std::tuple<std::vector<std::string>, std::vector<int64_t>, int64_t> host_profile(
    std::string group_name) {
  auto group = find_group(group_name);
  TORCH_CHECK_VALUE(group->profile().enabled(),
                    "host_profile: set FAST_ULYSSES_HOST_PROFILE=1 before creating the group");
  auto [ns, calls] = group->profile().take();
  return {transport::HostProfile::stage_names(), ns, calls};
}

}  // namespace

TORCH_LIBRARY_IMPL(fast_ulysses, CUDA, m) {
  m.impl("qk_norm_rope_all_to_all", &qk_norm_rope_cuda);
  m.impl("all_to_all_single_4d", &all_to_all_cuda);
  m.impl("all_to_all_single_4d_out", &all_to_all_out_cuda);
  m.impl("all_to_all_single_4d_borrowed", &all_to_all_borrowed_cuda);
}

// A CPU tensor reaches the same code, which refuses it with the group's device rule (instead of
// the dispatcher's "could not run with arguments from the CPU backend").
TORCH_LIBRARY_IMPL(fast_ulysses, CPU, m) {
  m.impl("qk_norm_rope_all_to_all", &qk_norm_rope_cuda);
  m.impl("all_to_all_single_4d", &all_to_all_cuda);
  m.impl("all_to_all_single_4d_out", &all_to_all_out_cuda);
  m.impl("all_to_all_single_4d_borrowed", &all_to_all_borrowed_cuda);
}

// The catch-all kernel serves every dispatch key (check_device takes a tensor of any device).
TORCH_LIBRARY_IMPL(fast_ulysses, CompositeExplicitAutograd, m) {
  m.impl("check_device", &check_device);
  m.impl("create_group", &create_group);
  m.impl("reserve", &reserve);
  m.impl("barrier", &barrier);
  m.impl("destroy_group", &destroy_group);
  m.impl("forget_group", &forget_group);
  m.impl("group_stats", &group_stats);
  m.impl("host_profile", &host_profile);
}

}  // namespace fast_ulysses::ops
