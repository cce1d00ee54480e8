#include "transport/ulysses_group.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <array>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "kernels/norm_rope_launch.h"
#include "ops/plan_errors.h"
#include "plan/call_signature.h"
#include "plan/group_stats.h"
#include "plan/tag_rules.h"
#include "transport/copy_engine.h"
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

void record_stream(const at::Tensor& tensor, cudaStream_t stream, int device_index) {
  if (!tensor.defined() || tensor.numel() == 0) return;
  c10::cuda::CUDACachingAllocator::recordStream(
      tensor.storage().data_ptr(), c10::cuda::getStreamFromExternal(stream, device_index));
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

// [first, last) bytes of a contiguous tensor.
std::pair<uintptr_t, uintptr_t> byte_range(const at::Tensor& t) {
  const auto first = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  return {first, first + static_cast<uintptr_t>(t.nbytes())};
}

bool overlap(std::pair<uintptr_t, uintptr_t> a, std::pair<uintptr_t, uintptr_t> b) {
  return a.first < a.second && b.first < b.second && a.first < b.second && b.first < a.second;
}

std::vector<int64_t> shape_of(const std::array<int64_t, 4>& shape) {
  return {shape.begin(), shape.end()};
}

std::string joined(const std::vector<int64_t>& values) {
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i)
    text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}

// The watchdog's name of a call (built when a tag's signature changes).
std::shared_ptr<const WatchedCall> watched_call(const Plan& plan, const std::string& tag,
                                                uint32_t signature) {
  const PlanRequest& r = plan.request;
  std::string text = "mode=" + std::to_string(static_cast<int>(r.mode)) + ", layout=" +
                     layout_name(r.layout) + ", batch=" + std::to_string(r.batch) +
                     ", head_dim=" + std::to_string(r.head_dim) + ", element_size=" +
                     std::to_string(r.element_size) + ", seq_splits=" + joined(r.seq_splits) +
                     ", head_splits=" + joined(r.head_splits) + ", tag '" + tag + "'";
  return std::make_shared<const WatchedCall>(WatchedCall{tag, signature, std::move(text)});
}

}  // namespace

UlyssesGroup::UlyssesGroup(std::string group_name, c10::Device device,
                           int64_t initial_pool_bytes)
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
  watchdog_ = std::make_unique<Watchdog>(group_name_, device_.index(), handshake_,
                                         watchdog_settings_);
}

UlyssesGroup::~UlyssesGroup() {
  watchdog_.reset();
  // (At process exit without destroy(): c10d's registry, built before any group, still exists.)
  for (const auto& work : works_) {
    if (!work->waited()) c10d::unregister_work(work);
    work->release();
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

// Opening handshake of `call`, one batch on M (or on a stream capturing M's part of a call,
// eager_graph.h): release my window for this call (its previous contents were read on C, joined
// into M, or copied out earlier on M) by writing the call's signature, then acquire every
// peer's: wait until it released what I last wrote there for the same call (and, with
// call.wait_owned, copied out its owned result), and mark it held again (1).
void UlyssesGroup::open(const Call& call, cudaStream_t stream) {
  const int P = world_size();
  for (int k = 1; k < P; ++k)
    batch_.write(handshake_.theirs((rank() + k) % P, call.slot, Word::kHeld), call.signature);
  handshake_.wait_peers(batch_, call.slot, Word::kHeld, call.signature);
  if (call.wait_owned) handshake_.wait_peers(batch_, call.slot, Word::kHeldOwned, 0);
  handshake_.set_peers(batch_, call.slot, Word::kHeld, 1);
  if (call.owned) handshake_.set_peers(batch_, call.slot, Word::kHeldOwned, 1);
  batch_.issue(stream);
}

// One full round on (slot, word), added to the batch: write 1 into every peer's word about me
// (fenced: after everything before it on M), then wait for every peer's 1 and reset it to 0.
void UlyssesGroup::full_round(int slot, Word word) {
  const int P = world_size();
  for (int k = 1; k < P; ++k) batch_.write(handshake_.theirs((rank() + k) % P, slot, word), 1);
  handshake_.wait_peers(batch_, slot, word, 1);
  handshake_.set_peers(batch_, slot, word, 0);
}

// Closing handshake, one batch on M after my copies: every peer's chunk has landed here and
// mine in every peer's window.
void UlyssesGroup::close(int slot, cudaStream_t stream) {
  full_round(slot, Word::kLanded);
  batch_.issue(stream);
}

void UlyssesGroup::send_remote(const at::Tensor& x, const Plan& plan, const Window& window,
                               cudaStream_t stream, bool batch) {
  const char* src = static_cast<const char*>(x.const_data_ptr());
  const int P = world_size();
  std::vector<PeerCopy> copies;
  copies.reserve(P - 1);
  for (int k = 1; k < P; ++k) {
    const int peer = (rank() + k) % P;
    copies.push_back({&plan.copies[peer], src, window.peers[peer]});
  }
  issue_copies(copies, stream, batch);
}

void UlyssesGroup::issue_peers(const at::Tensor& x, const at::Tensor& out, const Plan& plan,
                               const Window& window, const Call& call, cudaStream_t stream,
                               bool batch) {
  open(call, stream);
  send_remote(x, plan, window, stream, batch);
  if (!call.deferred) close(call.slot, stream);
  if (call.owned) finish_owned(out, plan, window, call.slot, false, stream);
}

bool UlyssesGroup::launch_cached(const at::Tensor& x, const at::Tensor& out, const Plan& plan,
                                 const Window& window, const Call& call, cudaStream_t stream) {
  if (!eager_graphs_.enabled()) return false;  // no key is built: every call's path
  EagerGraphs::Key signature = {call.slot, call.owned, call.deferred, call.wait_owned,
                                call.signature};
  for (const char* peer : window.peers) signature.push_back(reinterpret_cast<intptr_t>(peer));
  const auto add = [&signature](const std::vector<CopyDescriptor>& copies) {
    for (const CopyDescriptor& c : copies)
      signature.insert(signature.end(),
                       {c.src_offset, c.dst_offset, c.width, c.height, c.depth, c.src_pitch,
                        c.dst_pitch, c.src_slice_pitch, c.dst_slice_pitch});
  };
  add(plan.copies);
  if (call.owned) add(plan.collect);
  // An owned call's graph also copies the peers' chunks into `out`: its address is keyed too.
  std::vector<const void*> operands = {x.const_data_ptr()};
  if (call.owned) operands.push_back(out.const_data_ptr());
  // The graph holds this rank's own share too, on a branch of its own beside the handshake
  // and the peer copies (it needs neither): one launch is the whole call's work.
  const auto capture = [&](cudaStream_t capture_stream) {
    cudaStream_t branch = eager_graphs_.branch_stream();
    events_.join(capture_stream, branch);
    copy_own(plan.copies[rank()], x, out, branch);
    issue_peers(x, out, plan, window, call, capture_stream, false);
    events_.join(branch, capture_stream);
  };
  return eager_graphs_.launch(signature, operands, stream, capture);
}

void UlyssesGroup::check_device(const at::Tensor& x) const {
  TORCH_CHECK_VALUE(x.device() == device_, "x is on ", x.device(), " but the group is on ",
                    device_, ": inputs must be on the group's device");
}

void UlyssesGroup::check_out(const at::Tensor& out, const at::Tensor& x, const Plan& plan,
                             bool owned) const {
  TORCH_CHECK_VALUE(owned, "out: only the owned call (all_to_all_single_4d) fills a caller's "
                    "tensor; a borrowed result is the window itself");
  TORCH_CHECK_VALUE(out.device() == device_, "out is on ", out.device(),
                    " but the group is on ", device_, ": out must be on the group's device");
  TORCH_CHECK_VALUE(out.scalar_type() == x.scalar_type(), "out has dtype ", out.scalar_type(),
                    " but x has ", x.scalar_type(), ": out must have x's dtype");
  const std::vector<int64_t> shape = shape_of(plan.output_shape);
  TORCH_CHECK_VALUE(out.sizes() == c10::IntArrayRef(shape), "out has shape ", out.sizes(),
                    " but the call's output is ", c10::IntArrayRef(shape),
                    ": out must have the output's shape");
  TORCH_CHECK_VALUE(out.is_contiguous(), "out (shape ", out.sizes(), ", strides ",
                    out.strides(), ") is not contiguous: out must be a contiguous tensor");
  TORCH_CHECK_VALUE(!overlap(byte_range(out), byte_range(x)),
                    "out overlaps x in memory: the call reads x while it writes out; pass "
                    "an out that shares no bytes with x");
}

void UlyssesGroup::check_not_in_window(const char* name, const at::Tensor& t,
                                       const Window& window, const std::string& tag) const {
  const auto local = reinterpret_cast<uintptr_t>(window.local);
  TORCH_CHECK_VALUE(
      !overlap(byte_range(t), {local, local + static_cast<uintptr_t>(window.bytes)}), name,
      " overlaps the receive window of tag '", tag, "' (a borrowed result of that tag, or a "
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
  TagState& tag = known ? *known : tags_.emplace(tag_name, std::move(*fresh)).first->second;
  const bool deferred = !owned && !barrier;
  at::Tensor out = !owned             ? pool_.local_tensor(window, shape_of(plan.output_shape),
                                                           x.scalar_type())
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
  // An eager call whose caller asked for it leaves C's wait to the result's first use.
  const bool defer_join = defer_asked && world_size() > 1 && !deferred && !in_capture;
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

void UlyssesGroup::issue_one_rank(const Acquired& a, const at::Tensor& x, const Plan& plan,
                                  FusedNormRope* fused) {
  {
    StageScope stage(profile_, Stage::kOwnShare);
    if (fused) {
      launch_fused(*fused, {static_cast<char*>(a.out.data_ptr())}, a.caller);
    } else {
      copy_own(plan.copies[rank()], x, a.out, a.caller);
    }
  }
  // A deferred tag refuses its next call until barrier(), with peers or without (one rule).
  if (a.call.deferred) note_deferred(a.tag);
}

void UlyssesGroup::issue_fused(const Acquired& a, const at::Tensor& x, const Plan& plan,
                               FusedNormRope& fused) {
  {
    StageScope stage(profile_, Stage::kOpen);
    events_.join(a.caller, comm_);
    open(a.call, comm_);
  }
  {
    StageScope stage(profile_, Stage::kSend);
    launch_fused(fused, a.window.peers, comm_);  // this rank's own share too, into its window
  }
  if (a.call.deferred) {
    note_deferred(a.tag);
    StageScope stage(profile_, Stage::kFinish);
    hold_until_barrier(x, &fused.reads);
    return;
  }
  {
    StageScope stage(profile_, Stage::kClose);
    close(a.call.slot, comm_);
  }
  StageScope stage(profile_, Stage::kFinish);
  if (a.call.owned) finish_owned(a.out, plan, a.window, a.call.slot, true, comm_);
  rejoin(a, x, false, &fused.reads);
}

bool UlyssesGroup::issue_direct(const Acquired& a, const at::Tensor& x, const Plan& plan) {
  {
    StageScope stage(profile_, Stage::kSend);
    if (!launch_cached(x, a.out, plan, a.window, a.call, a.caller)) return false;
  }
  StageScope stage(profile_, Stage::kFinish);
  watch(a.caller, a.kind, a.tag);
  return true;
}

void UlyssesGroup::issue_on_comm(const Acquired& a, const at::Tensor& x, const Plan& plan,
                                 bool try_graph) {
  {
    StageScope stage(profile_, Stage::kOpen);
    // A borrowed call whose own share may go on C writes into the window that a deferred join's
    // work on M may still be writing: C waits for that work first (M holds nothing newer yet).
    if (unjoined_ && !a.call.owned) events_.join(comm_, a.caller);
    events_.join(a.caller, comm_);
  }
  bool in_graph = false;  // the own share went into the call's cached graph (on M)
  {
    // The closing handshake too: on M it needs nothing from the own share on C.
    StageScope stage(profile_, Stage::kSend);
    in_graph = try_graph && launch_cached(x, a.out, plan, a.window, a.call, comm_);
    if (!in_graph) issue_peers(x, a.out, plan, a.window, a.call, comm_, !a.capturing);
  }
  if (!in_graph) {
    StageScope stage(profile_, Stage::kOwnShare);
    copy_own(plan.copies[rank()], x, a.out, a.caller);
  }
  if (a.call.deferred) note_deferred(a.tag);
  StageScope stage(profile_, Stage::kFinish);
  if (a.call.deferred) {
    hold_until_barrier(x, nullptr);
  } else {
    rejoin(a, x, !in_graph, nullptr);
  }
}

void UlyssesGroup::note_deferred(TagState& tag) {
  tag.deferred = true;
  ++deferred_tags_;
}

// M reads x until barrier() joins it into C: x's memory must not be reused before then.
// (Otherwise C waits for M before the call returns, which orders any reuse of x or of `out`
// after M's last use of them, or a deferred join's Work holds them: no recordStream needed.)
void UlyssesGroup::hold_until_barrier(const at::Tensor& x, const std::vector<at::Tensor>* reads) {
  record_stream(x, comm_, device_.index());
  if (reads)
    for (const at::Tensor& read : *reads) record_stream(read, comm_, device_.index());
}

void UlyssesGroup::rejoin(const Acquired& a, const at::Tensor& x, bool own_share_on_caller,
                          const std::vector<at::Tensor>* reads) {
  if (!a.defer_join) {
    join_caller(a.caller, a.kind, a.tag.watched, a.call.slot, a.tag.calls, a.capturing);
    return;
  }
  // The own share went on C: M's closing event must come after it too.
  if (own_share_on_caller) events_.join(a.caller, comm_);
  defer_join(a.out, x, a.call.owned, a.kind, a.tag, a.caller);
  if (reads)
    for (const at::Tensor& read : *reads) record_stream(read, comm_, device_.index());
}

// C: this rank's own share of x into `out` (the result, or my window for a borrowed call; either
// way the output layout, starting at byte 0, where the descriptor's offsets point). A chunk that
// coalesces to one run of bytes is one cudaMemcpyAsync, what torch's copy_ issues for it too;
// a pitched chunk goes to our pitched copy kernel, launched directly (copy_by_kernel).
void UlyssesGroup::copy_own(const CopyDescriptor& own, const at::Tensor& x, const at::Tensor& out,
                            cudaStream_t caller) {
  const char* src = static_cast<const char*>(x.const_data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  const CopyDescriptor c = coalesced(own);
  if (c.height == 1 && c.depth == 1) {
    issue_copy(c, src, dst, caller);
  } else {
    copy_by_kernel(c, src, dst, caller);
  }
}

void UlyssesGroup::launch_fused(FusedNormRope& fused, const std::vector<char*>& windows,
                                cudaStream_t stream) {
  TORCH_CHECK(static_cast<int>(windows.size()) == fused.args.peers &&
                  fused.args.peers <= kernels::kMaxPeers,
              "fused norm + RoPE: ", windows.size(), " windows for ", fused.args.peers, " ranks");
  for (int j = 0; j < fused.args.peers; ++j) fused.args.dst[j] = windows[j];
  FU_CUDA_CHECK(kernels::launch_norm_rope(fused.args, stream));
}

// M: copy the peers' chunks out of the window into `out` (my own share is already there, from
// C), or the whole output when a fused kernel wrote my own share into the window too; then
// release the window to its writers.
void UlyssesGroup::finish_owned(const at::Tensor& out, const Plan& plan, const Window& window,
                                int slot, bool whole, cudaStream_t stream) {
  char* dst = static_cast<char*>(out.data_ptr());
  if (whole) {
    if (plan.output_bytes > 0)
      FU_CUDA_CHECK(cudaMemcpyAsync(dst, window.local, plan.output_bytes,
                                    cudaMemcpyDeviceToDevice, stream));
  } else {
    for (const CopyDescriptor& copy : plan.collect) issue_copy(copy, window.local, dst, stream);
  }
  const int P = world_size();
  for (int k = 1; k < P; ++k)
    batch_.write(handshake_.theirs((rank() + k) % P, slot, Word::kHeldOwned), 0);
  batch_.issue(stream);
}

// The caller's stream waits for everything issued on M so far (under capture this is the join
// a graph needs for every stream it forked); eager calls are watched until M gets there.
void UlyssesGroup::join_caller(cudaStream_t caller, CallKind kind,
                               std::shared_ptr<const WatchedCall> what, int slot, uint64_t call,
                               bool capturing) {
  auto done = events_.record(comm_);
  FU_CUDA_CHECK(cudaStreamWaitEvent(caller, *done, 0));
  if (!capturing) unjoined_ = false;
  if (!capturing) watchdog_->watch(std::move(done), kind, std::move(what), slot, call);
}

void UlyssesGroup::defer_join(const at::Tensor& result, const at::Tensor& x, bool owned,
                              CallKind kind, const TagState& tag, cudaStream_t caller) {
  // C does not wait for M before this returns: memory M still reads or writes (x, an owned
  // result) must not be handed to other work on C before M is done with it. The Work holds it
  // until then (call_work.h).
  std::vector<at::Tensor> held = {x};
  if (owned) held.push_back(result);
  auto done = events_.record(comm_);
  watchdog_->watch(done, kind, tag.watched, tag.slot, tag.calls);
  prune_works();
  auto work =
      c10::make_intrusive<CallWork>(std::move(done), device_.index(), caller, std::move(held));
  c10d::register_work(result, work);
  works_.push_back(std::move(work));
  unjoined_ = true;
  join_request().deferred = true;
}

void UlyssesGroup::prune_works() {
  while (!works_.empty()) {
    CallWork& oldest = *works_.front();
    if (!oldest.waited() || oldest.holds()) {
      if (!oldest.done()) return;  // still in flight: its result may yet be used
      // The device is past it: nothing is left to wait for or to hold.
      if (!oldest.waited()) c10d::unregister_work(works_.front());
      oldest.release();
    }
    works_.pop_front();
  }
}

void UlyssesGroup::watch(cudaStream_t caller, CallKind kind, const TagState& tag) {
  if (!watchdog_->enabled()) return;  // the event would exist for the watchdog alone
  watchdog_->watch(events_.record(caller), kind, tag.watched, tag.slot, tag.calls);
}

void UlyssesGroup::reserve(const std::vector<std::string>& tags,
                           const std::vector<int64_t>& window_bytes) {
  TORCH_CHECK_VALUE(tags.size() == window_bytes.size(), "reserve: ", tags.size(), " tags but ",
                    window_bytes.size(), " sizes");
  for (const std::string& tag : tags) {
    const TagState* known = find_tag(tag);
    if (known && known->deferred) check_not_deferred(tag);
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
  for (auto& entry : tags_) entry.second.deferred = false;
  deferred_tags_ = 0;
  if (world_size() == 1) return;
  ++barriers_;
  events_.join(caller, comm_);  // under capture this also brings M into the graph
  full_round(Handshake::kBarrierSlot, Word::kBarrierA);
  full_round(Handshake::kBarrierSlot, Word::kBarrierB);
  batch_.issue(comm_);
  join_caller(caller, CallKind::kBarrier, nullptr, Handshake::kBarrierSlot, barriers_,
              in_capture);
}

void UlyssesGroup::quiesce() {
  c10::cuda::CUDAGuard guard(device_);
  FU_CUDA_CHECK(cudaStreamSynchronize(comm_));
  FU_CUDA_CHECK(cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream(device_.index()).stream()));
  prune_works();  // every deferred join is done now: none is left in c10d's registry
  c10d::resolve_process_group(group_name_)->barrier()->wait();
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
