// How one call's work is issued, stream by stream (ulysses_group.h says which streams): the
// strategies UlyssesGroup::all_to_all chooses between once per call (acquire()), the handshakes,
// copies and cached graphs they issue, and the joins that give the caller's stream the work back.
#include "transport/ulysses_group.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "kernels/norm_rope_launch.h"
#include "transport/copy_engine.h"
#include "transport/cuda_check.h"

namespace fast_ulysses::transport {
namespace {

void record_stream(const at::Tensor& tensor, cudaStream_t stream, int device_index) {
  if (!tensor.defined() || tensor.numel() == 0) return;
  c10::cuda::CUDACachingAllocator::recordStream(
      tensor.storage().data_ptr(), c10::cuda::getStreamFromExternal(stream, device_index));
}

}  // namespace

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
  if (a.call.deferred) note_deferred(a.tag, a.capturing);
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
    note_deferred(a.tag, a.capturing);
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
    // (Never under capture: acquire() found the device past that work.)
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
  if (a.call.deferred) note_deferred(a.tag, a.capturing);
  StageScope stage(profile_, Stage::kFinish);
  if (a.call.deferred) {
    hold_until_barrier(x, nullptr);
  } else {
    rejoin(a, x, !in_graph, nullptr);
  }
}

void UlyssesGroup::note_deferred(TagState& tag, bool capturing) {
  tag.deferred = true;
  tag.deferred_eagerly = !capturing;
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
      FU_CUDA_CHECK(
          cudaMemcpyAsync(dst, window.local, plan.output_bytes, cudaMemcpyDeviceToDevice, stream));
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

}  // namespace fast_ulysses::transport
