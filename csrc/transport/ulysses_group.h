// The fast path's per-process state for one process group: windows, handshake, streams, plan
// cache, and the issue order of one all-to-all.
//
// Streams. The caller's stream C and the device's communication stream M (one per device). A
// call with peers forks M from C, runs the opening handshake and every remote copy on M (peer
// rank+1 first, then rank+2, ...: peers are not all hit at once), copies this rank's own share
// on C (straight into the result for an owned call; a same-device copy is an SM copy either
// way; a call launched from a cached graph, eager_graph.h, copies it on a branch of that graph
// instead), and closes on M. A call joins M back into C before it returns (the result is ready
// in C's stream order, as with c10d's all_to_all_single(async_op=False)), except an eager call
// made with join_request().defer (call_work.h): its result is registered with a c10d Work and C
// waits for M only when the result is first used (wait_tensor). A call launched from a cached
// graph that is closed by its own handshake, with no deferred call open and no deferred join
// asked for, runs its graph on C itself: nothing to fork or join.
// Contract. Every rank issues the same sequence of calls (shape, mode, tag, splits, layout,
// entry point), replays of captured graphs included; window and pool decisions depend on that
// sequence only. The handshake carries each call's signature (plan/call_signature.h): a rank
// writes into a peer's window only once the peer released it for the same call, so ranks that
// disagree never write into each other's windows. They wait instead, and the watchdog reports
// the wait, with both signatures, after FAST_ULYSSES_WATCHDOG_S seconds (default 300).
// Aliasing. An input (or an owned call's `out`) whose bytes overlap the window of the call's
// tag is refused before anything is issued: peers write into that window during the call.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <cuda_runtime_api.h>

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/norm_rope.h"
#include "plan/plan.h"
#include "transport/call_work.h"
#include "transport/eager_graph.h"
#include "transport/event_pool.h"
#include "transport/handshake.h"
#include "transport/host_profile.h"
#include "transport/key_hash.h"
#include "transport/watchdog.h"
#include "transport/window_pool.h"

namespace fast_ulysses::transport {

enum class Result { kOwned, kBorrowed };

// The fused QK RMSNorm + RoPE scatter in place of a mode-0 call's copies: `args` without its
// destinations (the group fills them in), and the tensors the kernel reads besides x (kept alive
// on the communication stream when the call is deferred).
struct FusedNormRope {
  kernels::NormRopeArgs args;
  std::vector<at::Tensor> reads;
};

class UlyssesGroup {
 public:
  // Collective: allocates and maps the pool (initial_pool_bytes of windows + the signal header).
  UlyssesGroup(std::string group_name, c10::Device device, int64_t initial_pool_bytes);
  ~UlyssesGroup();
  UlyssesGroup(const UlyssesGroup&) = delete;
  UlyssesGroup& operator=(const UlyssesGroup&) = delete;

  // The plan of a call signature (`key` encodes every argument the plan depends on), built by
  // `build` on first use and kept for the group's lifetime.
  const Plan& plan(const std::vector<int64_t>& key, const std::function<Plan()>& build);

  // Owned: returns a new tensor. Borrowed: returns a view of this rank's window for `tag`,
  // valid until the next call with that tag; with barrier == false the closing handshake is
  // left to barrier(). The result is ready in the caller's stream order, except for an eager
  // call made with join_request().defer, whose caller waits when the result is first used
  // (call_work.h).
  // Under CUDA graph capture a call that would need a new or larger window raises ValueError.
  // With `fused`, one kernel writes every chunk (this rank's own too, into its window) instead
  // of the copies; an owned result is then copied out of the window whole.
  // `out` (owned results only, or undefined): the caller's tensor to fill instead of a new one,
  // checked against the plan's output (ValueError) before anything is issued.
  at::Tensor all_to_all(const at::Tensor& x, const Plan& plan, const std::string& tag,
                        Result result, bool barrier, FusedNormRope* fused = nullptr,
                        const at::Tensor& out = at::Tensor());
  // Raises ValueError unless x is on the group's device (the ops check it before planning).
  void check_device(const at::Tensor& x) const;
  void reserve(const std::vector<std::string>& tags, const std::vector<int64_t>& window_bytes);
  // Closes every deferred borrowed call: afterwards, on the caller's stream, every peer's copies
  // issued before its barrier() have landed here.
  void barrier();
  // Waits for this rank's work, then for every rank (a process-group barrier), so no peer can
  // still be writing into this rank's memory when it is freed; then takes every result's Work
  // that was never waited for out of c10d's registry (nothing is left in flight).
  void quiesce();
  // The local half of quiesce(): this rank's device synchronized and its deferred joins pruned,
  // with no process-group barrier (for a group dropped without destroy()).
  void drain();

  int rank() const { return pool_.rank(); }
  int world_size() const { return pool_.world_size(); }
  c10::Device device() const { return device_; }
  // (name, value) of every key of plan/group_stats.h, in its order (sealed and wide_flags 0|1,
  // the latter 1 where the GPU takes 64-bit stream memory operations): the Python stats() dict.
  std::vector<std::pair<std::string, int64_t>> stats() const;
  HostProfile& profile() { return profile_; }

 private:
  struct TagState {
    int slot = 0;
    uint64_t calls = 0;     // calls issued with this tag (for the watchdog's report)
    bool deferred = false;  // last call was borrowed with barrier=false, barrier() not yet run
    bool deferred_eagerly = false;  // ... and that call was not being captured
    // An owned call on the tag was issued (eager, or captured into a graph): my held_owned
    // words on its slot may hold 1 from now on. Until then they are 0 and never waited for
    // outside a capture (open()).
    bool ever_owned = false;
    uint64_t hash = 0;  // plan/call_signature.h's tag_hash
    std::shared_ptr<const std::string> name;
    std::shared_ptr<const WatchedCall> watched;  // the tag's last call, for the watchdog
  };
  // A tag's state: `find_tag` is null for a tag never used; `new_tag` checks the tag limit and
  // builds the state of the next slot without keeping it (a call keeps it once its window is
  // secured, so a refused call uses no slot); `tag_state` finds or keeps.
  TagState* find_tag(const std::string& tag);
  TagState new_tag(const std::string& tag) const;
  TagState& tag_state(const std::string& tag);
  void check_not_deferred(const std::string& tag) const;
  const Window& window_for(const TagState& tag, int64_t bytes, bool capturing);
  // What the handshake of one call depends on besides its plan and window.
  struct Call {
    int slot;
    bool owned;
    bool deferred;       // borrowed with barrier=false: no closing handshake
    bool wait_owned;     // open() waits for my held_owned words too: they can be 1 only on a tag
                         // that has carried an owned call; a call being captured always waits
    uint32_t signature;  // plan/call_signature.h: what my release writes and my acquire awaits
  };
  // How a call's work is issued: chosen once, by acquire().
  enum class Strategy {
    kOneRank,     // P = 1: this rank's own share (a copy, or the fused kernel) on C is the call
    kFused,       // forked into M: the fused kernel between the opening and closing handshakes
    kCaptured,    // under the caller's capture: forked into M, issued call by call into its graph
    kDirect,      // eager, closed by its own handshake, nothing deferred on M that C has not
                  // joined: the call's cached graph launched on C itself, nothing to fork or join
    kCommStream,  // any other eager call: forked into M, its cached graph there or call by call
  };
  // One call as acquire() secured it, before anything is issued.
  struct Acquired {
    TagState& tag;
    const Window& window;
    at::Tensor out;  // the result: a new tensor, the caller's `out`, or a view of the window
    Call call;
    CallKind kind;
    cudaStream_t caller;  // C
    bool capturing;       // C is being captured into a CUDA graph
    bool defer_join;      // C's wait is left to the result's first use (join_request().defer)
    Strategy strategy;
  };
  // Everything about a call that can raise (capture state, `out`, tag, window, aliasing) and
  // the result's allocation, with nothing issued; a new tag is kept only once its window is
  // secured. Then the call is counted on its tag and its strategy chosen.
  Acquired acquire(const at::Tensor& x, const Plan& plan, const std::string& tag_name,
                   Result result, bool barrier, bool fused, bool defer_asked,
                   const at::Tensor& out_arg);
  Strategy choose_strategy(bool fused, bool capturing, bool deferred, bool defer_join) const;
  // The strategies (issue_direct: false when the call has no graph, with nothing issued).
  void issue_one_rank(const Acquired& a, const at::Tensor& x, const Plan& plan,
                      FusedNormRope* fused);
  void issue_fused(const Acquired& a, const at::Tensor& x, const Plan& plan, FusedNormRope& fused);
  bool issue_direct(const Acquired& a, const at::Tensor& x, const Plan& plan);
  // Forked into M: the cached graph there (with `try_graph`) or call by call, then the join.
  void issue_on_comm(const Acquired& a, const at::Tensor& x, const Plan& plan, bool try_graph);
  // A borrowed call with barrier=false: its tag refuses the next call until barrier().
  void note_deferred(TagState& tag, bool capturing);
  // A deferred call's x (and a fused call's other inputs) stay unused until M is done with them:
  // barrier() joins M into C.
  void hold_until_barrier(const at::Tensor& x, const std::vector<at::Tensor>* reads);
  // C gets a forked call's work back: it waits for M now (join_caller), or at the result's first
  // use (defer_join; M first waits for the own share when it ran on C).
  void rejoin(const Acquired& a, const at::Tensor& x, bool own_share_on_caller,
              const std::vector<at::Tensor>* reads);
  // `out` against the call (device, dtype, shape, contiguity, no overlap with x): ValueError.
  void check_out(const at::Tensor& out, const at::Tensor& x, const Plan& plan, bool owned) const;
  // Refuses (ValueError) a tensor whose bytes overlap `window` (this rank's part of it).
  void check_not_in_window(const char* name, const at::Tensor& t, const Window& window,
                           const std::string& tag) const;
  // Leaves the caller's wait to a c10d Work registered for `result` (call_work.h).
  void defer_join(const at::Tensor& result, const at::Tensor& x, bool owned, CallKind kind,
                  const TagState& tag, cudaStream_t caller);
  // Drops, oldest first, the Works that were waited for on the caller's stream or that the
  // device has passed (unregistering those never waited for, letting go of what they hold).
  void prune_works();
  // Opening handshake, on comm_ or a stream being captured.
  void open(const Call& call, cudaStream_t stream);
  void close(int slot, cudaStream_t stream);
  void full_round(int slot, Word word);  // adds to batch_
  void send_remote(const at::Tensor& x, const Plan& plan, const Window& window, cudaStream_t stream,
                   bool batch);
  // Opening handshake, peer copies, (unless deferred) closing handshake and (owned) the
  // peers' chunks into `out`, call by call on `stream` (comm_, or a stream being captured).
  void issue_peers(const at::Tensor& x, const at::Tensor& out, const Plan& plan,
                   const Window& window, const Call& call, cudaStream_t stream, bool batch);
  // The same work and this rank's own share (on a branch beside it) launched on `stream` from
  // the call's cached graph (eager_graph.h): true when it was; false: nothing was issued.
  bool launch_cached(const at::Tensor& x, const at::Tensor& out, const Plan& plan,
                     const Window& window, const Call& call, cudaStream_t stream);
  void copy_own(const CopyDescriptor& own, const at::Tensor& x, const at::Tensor& out,
                cudaStream_t caller);
  void launch_fused(FusedNormRope& fused, const std::vector<char*>& windows, cudaStream_t stream);
  void finish_owned(const at::Tensor& out, const Plan& plan, const Window& window, int slot,
                    bool whole, cudaStream_t stream);
  // M's closing event joined into the caller's stream, and watched unless capturing.
  void join_caller(cudaStream_t caller, CallKind kind, std::shared_ptr<const WatchedCall> what,
                   int slot, uint64_t call, bool capturing);
  // The watchdog watches an event recorded on `caller` now (a call launched on C itself).
  void watch(cudaStream_t caller, CallKind kind, const TagState& tag);

  std::string group_name_;
  c10::Device device_;
  WatchdogSettings watchdog_settings_;  // parsed before anything collective can happen
  HostProfile profile_;                 // FAST_ULYSSES_HOST_PROFILE
  bool eager_graphs_on_;                // FAST_ULYSSES_EAGER_GRAPHS (eager_graphs_ comes later)
  WindowPool pool_;
  Handshake handshake_;
  EventPool events_;
  cudaStream_t comm_ = nullptr;  // shared by every group on the device, never destroyed
  std::unordered_map<std::string, TagState> tags_;
  std::unordered_map<std::vector<int64_t>, Plan, KeyHash> plans_;
  MemOpBatch batch_;  // reused: its storage stays allocated between calls
  EagerGraphs eager_graphs_;
  uint64_t barriers_ = 0;
  int deferred_tags_ = 0;  // tags whose last call was deferred: M holds work C has not joined
  std::unique_ptr<Watchdog> watchdog_;
  std::deque<c10::intrusive_ptr<CallWork>> works_;  // deferred joins, oldest first
  bool unjoined_ = false;  // M holds a deferred join's work that C has not waited for
  // A call of this group was captured into a CUDA graph: no eager call defers its join from then
  // on (a replay, launched on C by the caller, could not be ordered after such work on M).
  bool captured_ = false;
  // The stream of the last eager call or barrier (none yet: nullopt; the default stream's
  // handle is null). The strategies order a call after the previous ones through one caller
  // stream; a call from another stream first makes M wait for that stream, and counts M as
  // unjoined, so it and the calls after it go through M until joined (at P = 1, where there is
  // no M, the caller's stream waits for the last one).
  std::optional<cudaStream_t> last_caller_;
  // Orders `caller` after the last caller's work when they differ (above); then `caller` is the
  // last caller. Not under capture: a graph's work is ordered by its replay's stream.
  void follow_last_caller(cudaStream_t caller);
};

}  // namespace fast_ulysses::transport
