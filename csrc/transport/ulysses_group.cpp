#include "transport/ulysses_group.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <array>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "ops/plan_errors.h"
#include "plan/call_signature.h"
#include "plan/group_stats.h"
#include "plan/tag_rules.h"
#include "transport/cuda_check.h"
#include "transport/driver_api.h"

namespace fast_ulysses::transport {
namespace {

// One communication stream per device for the whole process, never destroyed: the caching
// allocator records events on it for every tensor it touched (recordStream), which may be freed
// long after the group that issued the work is gone.
cudaStream_t communication_stream(int device_index) {
  static std::mutex mutex;
  static std::unordered_map<int, cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mutex);
  auto found = streams.find(device_index);
  if (found != streams.end()) return found->second;
  int least = 0, greatest = 0;
  FU_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t stream = nullptr;
  FU_CUDA_CHECK(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, greatest));
  return streams[device_index] = stream;
}

// Whether `stream` is being captured into a CUDA graph; raises if its capture was invalidated.
bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  FU_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  TORCH_CHECK(status != cudaStreamCaptureStatusInvalidated,
              "fast-ulysses: the caller's stream is in an invalidated CUDA graph capture");
  return status == cudaStreamCaptureStatusActive;
}

constexpr size_t kMaxCachedPlans = 1024;

// [first, last) bytes a tensor's elements span, from its first element to one past its last: a
// strided view (a packed projection's q) spans its gaps too, which only makes the overlap tests
// below (an input in the tag's window, out= overlapping x) stricter, never blind to an element.
// (torch strides are >= 0, so the first element is at data_ptr.)
std::pair<uintptr_t, uintptr_t> byte_range(const at::Tensor& t) {
  const auto first = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  if (t.numel() == 0) return {first, first};
  int64_t last = 0;
  for (int64_t k = 0; k < t.dim(); ++k) last += (t.size(k) - 1) * t.stride(k);
  return {first, first + static_cast<uintptr_t>((last + 1) * t.element_size())};
}

bool overlap(std::pair<uintptr_t, uintptr_t> a, std::pair<uintptr_t, uintptr_t> b) {
  return a.first < a.second && b.first < b.second && a.first < b.second && b.first < a.second;
}

std::vector<int64_t> shape_of(const std::array<int64_t, 4>& shape) {
  return {shape.begin(), shape.end()};
}

std::string joined(const std::vector<int64_t>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

// The watchdog's name of a call (built when a tag's signature changes).
std::shared_ptr<const WatchedCall> watched_call(const Plan& plan, const std::string& tag,
                                                uint32_t signature) {
  const PlanRequest& r = plan.request;
  std::string text =
      "mode=" + std::to_string(static_cast<int>(r.mode)) + ", layout=" + layout_name(r.layout) +
      ", batch=" + std::to_string(r.batch) + ", head_dim=" + std::to_string(r.head_dim) +
      ", element_size=" + std::to_string(r.element_size) + ", seq_splits=" + joined(r.seq_splits) +
      ", head_splits=" + joined(r.head_splits) + ", tag '" + tag + "'";
  return std::make_shared<const WatchedCall>(WatchedCall{tag, signature, std::move(text)});
}

}  // namespace

UlyssesGroup::UlyssesGroup(std::string group_name, c10::Device device, int64_t initial_pool_bytes)
    : group_name_(std::move(group_name)),
      device_(device),
      watchdog_settings_(watchdog_settings()),
      profile_(host_profile_enabled()),
      eager_graphs_on_(eager_graphs_enabled()),
      pool_(group_name_, device, initial_pool_bytes),
      handshake_(pool_.rank(), pool_.headers(), supports_64_bit_mem_ops(device.index())),
      eager_graphs_(eager_graphs_on_) {
  c10::cuda::CUDAGuard guard(device_);
  comm_ = communication_stream(device_.index());
  watchdog_ =
      std::make_unique<Watchdog>(group_name_, device_.index(), handshake_, watchdog_settings_);
}

UlyssesGroup::~UlyssesGroup() {
  watchdog_.reset();
  // (At process exit without destroy(): c10d's registry, built before any group, still exists.)
  for (const auto& work : works_) {
    if (!work->waited()) c10d::unregister_work(work);
    work->release_after_caller();
  }
}

const Plan& UlyssesGroup::plan(const std::vector<int64_t>& key,
                               const std::function<Plan()>& build) {
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second;
  if (plans_.size() >= kMaxCachedPlans) plans_.clear();  // shapes that vary without end
  return plans_.emplace(key, build()).first->second;
}

UlyssesGroup::TagState* UlyssesGroup::find_tag(const std::string& tag) {
  auto found = tags_.find(tag);
  return found == tags_.end() ? nullptr : &found->second;
}

UlyssesGroup::TagState UlyssesGroup::new_tag(const std::string& tag) const {
  translate_plan_errors([&] {
    check_tag_use(tag, static_cast<int64_t>(tags_.size()), false, false);
    return 0;
  });
  TagState state;
  state.slot = static_cast<int>(tags_.size());  // first use order: the same on every rank
  state.name = std::make_shared<const std::string>(tag);
  state.hash = tag_hash(tag);
  return state;
}

UlyssesGroup::TagState& UlyssesGroup::tag_state(const std::string& tag) {
  if (TagState* found = find_tag(tag)) return *found;
  return tags_.emplace(tag, new_tag(tag)).first->second;
}

// A deferred tag refuses its next use until barrier(): a call, or reserve() (one rule, as on
// TorchUlyssesGroup).
void UlyssesGroup::check_not_deferred(const std::string& tag) const {
  translate_plan_errors([&] {
    check_tag_use(tag, static_cast<int64_t>(tags_.size()), true, true);
    return 0;
  });
}

const Window& UlyssesGroup::window_for(const TagState& tag, int64_t bytes, bool capturing) {
  if (!capturing) return pool_.acquire(tag.slot, *tag.name, bytes);
  const Window* window = pool_.find(tag.slot, bytes);
  TORCH_CHECK_VALUE(window != nullptr, "tag '", *tag.name, "' needs a window of ", bytes,
                    " bytes, which it does not have yet, and windows cannot be allocated while "
                    "a CUDA graph is being captured: before capturing, make one eager call with "
                    "this tag and shape (a warm-up), or declare the call with group.reserve()");
  return *window;
}

void UlyssesGroup::check_device(const at::Tensor& x) const {
  TORCH_CHECK_VALUE(x.device() == device_, "x is on ", x.device(), " but the group is on ", device_,
                    ": inputs must be on the group's device");
}

void UlyssesGroup::check_out(const at::Tensor& out, const at::Tensor& x, const Plan& plan,
                             bool owned) const {
  TORCH_CHECK_VALUE(owned,
                    "out: only the owned call (all_to_all_single_4d) fills a caller's "
                    "tensor; a borrowed result is the window itself");
  TORCH_CHECK_VALUE(out.device() == device_, "out is on ", out.device(), " but the group is on ",
                    device_, ": out must be on the group's device");
  TORCH_CHECK_VALUE(out.scalar_type() == x.scalar_type(), "out has dtype ", out.scalar_type(),
                    " but x has ", x.scalar_type(), ": out must have x's dtype");
  const std::vector<int64_t> shape = shape_of(plan.output_shape);
  TORCH_CHECK_VALUE(out.sizes() == c10::IntArrayRef(shape), "out has shape ", out.sizes(),
                    " but the call's output is ", c10::IntArrayRef(shape),
                    ": out must have the output's shape");
  TORCH_CHECK_VALUE(out.is_contiguous(), "out (shape ", out.sizes(), ", strides ", out.strides(),
                    ") is not contiguous: out must be a contiguous tensor");
  TORCH_CHECK_VALUE(!overlap(byte_range(out), byte_range(x)),
                    "out overlaps x in memory: the call reads x while it writes out; pass "
                    "an out that shares no bytes with x");
}

void UlyssesGroup::check_not_in_window(const char* name, const at::Tensor& t, const Window& window,
                                       const std::string& tag) const {
  const auto local = reinterpret_cast<uintptr_t>(window.local);
  TORCH_CHECK_VALUE(
      !overlap(byte_range(t), {local, local + static_cast<uintptr_t>(window.bytes)}), name,
      " overlaps the receive window of tag '", tag,
      "' (a borrowed result of that tag, or a "
      "view of one): peers write into that window during this call, so its bytes would change "
      "while they are read. Use another tag for this call, or clone() the borrowed result "
      "first");
}

at::Tensor UlyssesGroup::all_to_all(const at::Tensor& x, const Plan& plan,
                                    const std::string& tag_name, Result result, bool barrier,
                                    FusedNormRope* fused, const at::Tensor& out_arg) {
  c10::cuda::CUDAGuard guard(device_);
  JoinRequest& join = join_request();
  join.deferred = false;
  Acquired a = acquire(x, plan, tag_name, result, barrier, fused != nullptr, join.defer, out_arg);
  ProfiledCall profiled(profile_, Stage::kSetup);
  switch (a.strategy) {
    case Strategy::kOneRank:
      issue_one_rank(a, x, plan, fused);
      break;
    case Strategy::kFused:
      issue_fused(a, x, plan, *fused);
      break;
    case Strategy::kCaptured:
      issue_on_comm(a, x, plan, false);
      break;
    case Strategy::kDirect:
      // A direct launch that found no graph would find none on M either: call by call there.
      if (!issue_direct(a, x, plan)) issue_on_comm(a, x, plan, false);
      break;
    case Strategy::kCommStream:
      issue_on_comm(a, x, plan, true);
      break;
  }
  return std::move(a.out);
}

UlyssesGroup::Acquired UlyssesGroup::acquire(const at::Tensor& x, const Plan& plan,
                                             const std::string& tag_name, Result result,
                                             bool barrier, bool fused, bool defer_asked,
                                             const at::Tensor& out_arg) {
  cudaStream_t caller = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
  const bool in_capture = capturing(caller);
  const bool owned = result == Result::kOwned;
  if (out_arg.defined()) check_out(out_arg, x, plan, owned);
  TagState* known = find_tag(tag_name);
  if (known && known->deferred) check_not_deferred(tag_name);
  // Everything that can raise (plan, window, sealed pool, capture) runs before anything is
  // issued, and so does the result's allocation (ordered before the fork into M). A new tag is
  // kept only once its window is secured: a refused call uses no slot.
  std::optional<TagState> fresh;
  if (!known) fresh = new_tag(tag_name);
  const Window& window = window_for(known ? *known : *fresh, plan.window_bytes, in_capture);
  check_not_in_window("x", x, window, tag_name);
  if (out_arg.defined()) check_not_in_window("out", out_arg, window, tag_name);
  if (in_capture && unjoined_) {
    // Eager work on M whose caller never waited for it cannot be waited for inside a graph (the
    // dependency would cross the capture's boundary): the device must be past it already, as it
    // is after torch.cuda.graph's synchronize.
    TORCH_CHECK(works_.empty() || works_.back()->done(),
                "fast-ulysses: a CUDA graph capture began while an eager all-to-all of this "
                "group was still running on the device, its caller's stream never made to wait "
                "for it: call torch.cuda.synchronize() before capturing (torch.cuda.graph does)");
    unjoined_ = false;  // the device is past every call M was given before the capture
  }
  // (Before the tag's state changes. Should the result's allocation still fail, this has only
  // ordered M, or C, after work that came before the call anyway.)
  if (!in_capture) follow_last_caller(caller);
  TagState& tag = known ? *known : tags_.emplace(tag_name, std::move(*fresh)).first->second;
  const bool deferred = !owned && !barrier;
  at::Tensor out = !owned ? pool_.local_tensor(window, shape_of(plan.output_shape), x.scalar_type())
                   : out_arg.defined() ? out_arg
                                       : at::empty(shape_of(plan.output_shape), x.options());
  ++tag.calls;
  // An owned call's held_owned words are set in its open(): from its issue on (eagerly, or in a
  // graph being captured, which may replay at any time) every call on the tag waits for them.
  const Call call = {tag.slot, owned, deferred, in_capture || tag.ever_owned,
                     call_signature(plan.request_hash, tag.hash)};
  if (owned) tag.ever_owned = true;
  if (!tag.watched || tag.watched->signature != call.signature)
    tag.watched = watched_call(plan, *tag.name, call.signature);
  // An eager call whose caller asked for it leaves C's wait to the result's first use, unless a
  // graph of this group may be replayed: a replay's captured work is ordered after C's work
  // only, so an eager call's work on M that C never waited for could run beside it, on the same
  // tag's window and handshake words.
  if (in_capture) captured_ = true;
  const bool defer_join = defer_asked && world_size() > 1 && !deferred && !captured_;
  return Acquired{tag,
                  window,
                  std::move(out),
                  call,
                  owned ? CallKind::kOwned : CallKind::kBorrowed,
                  caller,
                  in_capture,
                  defer_join,
                  choose_strategy(fused, in_capture, deferred, defer_join)};
}

UlyssesGroup::Strategy UlyssesGroup::choose_strategy(bool fused, bool capturing, bool deferred,
                                                     bool defer_join) const {
  if (world_size() == 1) return Strategy::kOneRank;
  if (fused) return Strategy::kFused;
  if (capturing) return Strategy::kCaptured;
  // A call closed by its own handshake, with nothing deferred on M before it, launches its
  // cached graph on C itself: C would wait for all of it anyway, and M holds nothing C has not
  // waited for, so the fork into M and the join back (four driver calls) order nothing. (Nor
  // with a deferred join's work on M that C has not waited for.)
  if (!deferred && !defer_join && deferred_tags_ == 0 && !unjoined_) return Strategy::kDirect;
  return Strategy::kCommStream;
}

void UlyssesGroup::reserve(const std::vector<std::string>& tags,
                           const std::vector<int64_t>& window_bytes) {
  TORCH_CHECK_VALUE(tags.size() == window_bytes.size(), "reserve: ", tags.size(), " tags but ",
                    window_bytes.size(), " sizes");
  // Every tag is checked before any is kept, so a refused reserve() declares no tag and seals
  // nothing (as on TorchUlyssesGroup): the new tags are counted against the limit together.
  std::unordered_set<std::string> fresh;
  for (const std::string& tag : tags) {
    const TagState* known = find_tag(tag);
    if (known && known->deferred) check_not_deferred(tag);
    if (!known && fresh.insert(tag).second)
      translate_plan_errors([&] {
        const auto so_far = static_cast<int64_t>(tags_.size() + fresh.size() - 1);
        check_tag_use(tag, so_far, false, false);
        return 0;
      });
  }
  std::vector<std::pair<int, int64_t>> slots;
  for (size_t i = 0; i < tags.size(); ++i)
    slots.emplace_back(tag_state(tags[i]).slot, window_bytes[i]);
  pool_.reserve(slots);
}

// Two full rounds of flags (A then B), each waited and reset: a peer can write its next
// barrier's A flag only after passing this barrier's B round, which every rank enters only
// after resetting its A flags. So no flag is ever written twice before it is reset.
void UlyssesGroup::barrier() {
  c10::cuda::CUDAGuard guard(device_);
  cudaStream_t caller = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
  const bool in_capture = capturing(caller);
  if (in_capture) {
    // A captured barrier is ordered after the graph's own calls on every replay, never after
    // an eager call's transfer: it cannot close a tag deferred outside the capture.
    for (const auto& [name, tag] : tags_)
      TORCH_CHECK_VALUE(!(tag.deferred && tag.deferred_eagerly),
                        "barrier() is being captured "
                        "into a CUDA graph while tag '",
                        name,
                        "' has an eager barrier=False "
                        "call not yet closed: a replayed barrier would not wait for that call's "
                        "transfer. Call barrier() before capturing, or capture the "
                        "barrier=False calls with it");
  }
  for (auto& entry : tags_) entry.second.deferred = false;
  deferred_tags_ = 0;
  if (world_size() == 1) return;
  ++barriers_;
  if (!in_capture) follow_last_caller(caller);  // as for a call
  events_.join(caller, comm_);                  // under capture this also brings M into the graph
  full_round(Handshake::kBarrierSlot, Word::kBarrierA);
  full_round(Handshake::kBarrierSlot, Word::kBarrierB);
  batch_.issue(comm_);
  join_caller(caller, CallKind::kBarrier, nullptr, Handshake::kBarrierSlot, barriers_, in_capture);
}

void UlyssesGroup::follow_last_caller(cudaStream_t caller) {
  if (last_caller_ && *last_caller_ != caller) {
    // The last caller's work (a cached graph launched on it, or its own share) is ordered
    // before this call's through M, not through this caller's stream.
    if (world_size() == 1) {
      events_.join(*last_caller_, caller);
    } else {
      events_.join(*last_caller_, comm_);
      unjoined_ = true;
    }
  }
  last_caller_ = caller;
}

void UlyssesGroup::quiesce() {
  drain();
  c10d::resolve_process_group(group_name_)->barrier()->wait();
}

void UlyssesGroup::drain() {
  c10::cuda::CUDAGuard guard(device_);
  // The whole device, not the current stream: a call's work may sit on any stream it was made
  // from (a cached graph run on the caller's stream, a borrowed call's own share), and the
  // thread draining (a collected group's finalizer, say) need not be the one that made them.
  FU_CUDA_CHECK(cudaDeviceSynchronize());
  prune_works();  // every deferred join is done now: none is left in c10d's registry
}

std::vector<std::pair<std::string, int64_t>> UlyssesGroup::stats() const {
  std::array<int64_t, kStatNames.size()> values{};
  const auto set = [&values](Stat stat, int64_t value) {
    values[static_cast<size_t>(stat)] = value;
  };
  set(Stat::kPoolBytes, pool_.capacity());
  set(Stat::kUsedBytes, pool_.used());
  set(Stat::kSegments, pool_.segments());
  set(Stat::kSealed, pool_.sealed() ? 1 : 0);
  set(Stat::kTags, static_cast<int64_t>(tags_.size()));
  set(Stat::kDeferred, deferred_tags_);
  set(Stat::kGraphCalls, eager_graphs_.launches());
  set(Stat::kGraphsCached, eager_graphs_.graphs());
  set(Stat::kEagerOnlySignatures, eager_graphs_.eager_only());
  set(Stat::kWideFlags, handshake_.wide() ? 1 : 0);
  std::vector<std::pair<std::string, int64_t>> named;
  for (size_t i = 0; i < kStatNames.size(); ++i) named.emplace_back(kStatNames[i], values[i]);
  return named;
}

}  // namespace fast_ulysses::transport
