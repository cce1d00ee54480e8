#include "transport/ulysses_group.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <cstdlib>
#include <mutex>
#include <unordered_map>
#include <sstream>

#include "transport/copy_engine.h"
#include "transport/cuda_check.h"

namespace fast_ulysses::transport {
namespace {

// The c10d Work of an owned result: wait() makes the current stream wait for the transfer's
// closing event. Never a host synchronize.
class TransferWork : public c10d::Work {
 public:
  TransferWork(std::shared_ptr<cudaEvent_t> done, int device_index)
      : done_(std::move(done)), device_index_(device_index) {}
  bool isCompleted() override { return cudaEventQuery(*done_) == cudaSuccess; }
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    FU_CUDA_CHECK(cudaStreamWaitEvent(
        c10::cuda::getCurrentCUDAStream(device_index_).stream(), *done_, 0));
    return true;
  }
  void synchronize() override { FU_CUDA_CHECK(cudaEventSynchronize(*done_)); }

 private:
  std::shared_ptr<cudaEvent_t> done_;
  int device_index_;
};

double watchdog_timeout_s() {
  const char* value = std::getenv("FAST_ULYSSES_WATCHDOG_S");
  return value ? std::atof(value) : 300.0;
}

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

}  // namespace

UlyssesGroup::UlyssesGroup(std::string group_name, c10::Device device,
                           int64_t initial_pool_bytes)
    : group_name_(std::move(group_name)),
      device_(device),
      pool_(group_name_, device, initial_pool_bytes),
      handshake_(pool_.rank(), pool_.headers()) {
  c10::cuda::CUDAGuard guard(device_);
  comm_ = communication_stream(device_.index());
  watchdog_ = std::make_unique<Watchdog>(group_name_, device_.index(), world_size(), handshake_,
                                         watchdog_timeout_s());
}

UlyssesGroup::~UlyssesGroup() { watchdog_.reset(); }

UlyssesGroup::TagState& UlyssesGroup::tag_state(const std::string& tag) {
  auto found = tags_.find(tag);
  if (found != tags_.end()) return found->second;
  TORCH_CHECK_VALUE(static_cast<int>(tags_.size()) < Handshake::kMaxTags, "tag '", tag,
                    "' would be the group's tag number ", tags_.size() + 1, ": at most ",
                    Handshake::kMaxTags, " distinct tags per group");
  TagState state;
  state.slot = static_cast<int>(tags_.size());  // first use order: the same on every rank
  return tags_.emplace(tag, state).first->second;
}

std::shared_ptr<cudaEvent_t> UlyssesGroup::record(cudaStream_t from) {
  auto event = std::shared_ptr<cudaEvent_t>(new cudaEvent_t(nullptr), [](cudaEvent_t* e) {
    if (*e) cudaEventDestroy(*e);
    delete e;
  });
  FU_CUDA_CHECK(cudaEventCreateWithFlags(event.get(), cudaEventDisableTiming));
  FU_CUDA_CHECK(cudaEventRecord(*event, from));
  return event;
}

void UlyssesGroup::join(cudaStream_t from, cudaStream_t waiter) {
  FU_CUDA_CHECK(cudaStreamWaitEvent(waiter, *record(from), 0));
}

void UlyssesGroup::announce_consumed(cudaStream_t stream, TagState& tag, uint64_t epoch) {
  for (int p = 0; p < world_size(); ++p)
    handshake_.signal(stream, p, tag.slot, Signal::kConsumed, epoch);
  tag.consumed = epoch;
}

void UlyssesGroup::send_remote(const at::Tensor& x, const Plan& plan, const Window& window,
                               const TagState& tag, bool signal_landed) {
  const char* src = static_cast<const char*>(x.const_data_ptr());
  const int P = world_size();
  for (int k = 1; k < P; ++k) {
    const int peer = (rank() + k) % P;
    handshake_.wait(comm_, tag.slot, Signal::kConsumed, peer, tag.epoch - 1);
    issue_copy(plan.copies[peer], src, window.peers[peer], comm_);
    if (signal_landed) handshake_.signal(comm_, peer, tag.slot, Signal::kLanded, tag.epoch);
  }
}

void UlyssesGroup::wait_landed(cudaStream_t stream, const TagState& tag) {
  for (int p = 0; p < world_size(); ++p)
    if (p != rank()) handshake_.wait(stream, tag.slot, Signal::kLanded, p, tag.epoch);
}

at::Tensor UlyssesGroup::all_to_all(const at::Tensor& x, const Plan& plan,
                                    const std::string& tag_name, Result result, bool barrier) {
  TORCH_CHECK_VALUE(x.device() == device_, "x is on ", x.device(), " but the group is on ",
                    device_, ": inputs must be on the group's device");
  TagState& tag = tag_state(tag_name);
  TORCH_CHECK_VALUE(!tag.deferred, "tag '", tag_name,
                    "' was last used with barrier=False and group.barrier() has not run since: "
                    "call group.barrier() before reusing the tag");
  // Everything that can raise (plan, window, sealed pool) has run before anything is issued.
  const Window& window = pool_.acquire(tag.slot, tag_name, plan.window_bytes);
  c10::cuda::CUDAGuard guard(device_);
  cudaStream_t caller = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
  const uint64_t epoch = ++tag.epoch;

  // A borrowed window of the previous call is released here, after the caller's reads of it.
  if (tag.consumed < epoch - 1) announce_consumed(caller, tag, epoch - 1);
  const bool deferred = result == Result::kBorrowed && !barrier;
  join(caller, comm_);
  send_remote(x, plan, window, tag, /*signal_landed=*/!deferred);
  handshake_.wait(caller, tag.slot, Signal::kConsumed, rank(), epoch - 1);
  copy_local(plan.copies[rank()], x,
             pool_.local_view(window, window.bytes).view(x.scalar_type()));
  record_stream(x, comm_, device_.index());

  if (result == Result::kOwned) return close_owned(x, plan, window, tag, tag_name);

  at::Tensor view = pool_.local_view(window, plan.output_bytes)
                        .view(x.scalar_type())
                        .view(std::vector<int64_t>(plan.output_shape.begin(),
                                                   plan.output_shape.end()));
  if (deferred) {
    tag.deferred = true;  // barrier() closes it and joins comm_ into the caller
    return view;
  }
  wait_landed(caller, tag);
  join(comm_, caller);  // the caller may overwrite x once this call's copies have read it
  std::ostringstream what;
  what << "rank " << rank() << ": borrowed call #" << epoch << " of tag '" << tag_name << "'";
  watchdog_->watch(record(caller), what.str(), tag.slot, epoch);
  return view;
}

at::Tensor UlyssesGroup::close_owned(const at::Tensor& x, const Plan& plan,
                                     const Window& window, TagState& tag,
                                     const std::string& tag_name) {
  cudaStream_t caller = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
  join(caller, comm_);  // after my own share
  wait_landed(comm_, tag);
  at::Tensor out = at::empty(
      std::vector<int64_t>(plan.output_shape.begin(), plan.output_shape.end()), x.options());
  if (plan.output_bytes > 0)
    FU_CUDA_CHECK(cudaMemcpyAsync(out.data_ptr(), window.local, plan.output_bytes,
                                  cudaMemcpyDeviceToDevice, comm_));
  announce_consumed(comm_, tag, tag.epoch);
  record_stream(out, comm_, device_.index());
  auto done = record(comm_);
  c10d::register_work(out, c10::make_intrusive<TransferWork>(done, device_.index()));
  std::ostringstream what;
  what << "rank " << rank() << ": call #" << tag.epoch << " of tag '" << tag_name << "'";
  watchdog_->watch(std::move(done), what.str(), tag.slot, tag.epoch);
  return out;
}

void UlyssesGroup::reserve(const std::vector<std::string>& tags,
                           const std::vector<int64_t>& window_bytes) {
  TORCH_CHECK_VALUE(tags.size() == window_bytes.size(), "reserve: ", tags.size(), " tags but ",
                    window_bytes.size(), " sizes");
  std::vector<std::pair<int, int64_t>> slots;
  for (size_t i = 0; i < tags.size(); ++i)
    slots.emplace_back(tag_state(tags[i]).slot, window_bytes[i]);
  pool_.reserve(slots);
}

void UlyssesGroup::barrier() {
  c10::cuda::CUDAGuard guard(device_);
  cudaStream_t caller = c10::cuda::getCurrentCUDAStream(device_.index()).stream();
  const uint64_t epoch = ++barrier_epoch_;
  join(caller, comm_);
  for (int p = 0; p < world_size(); ++p)
    if (p != rank()) handshake_.signal(comm_, p, Handshake::kBarrierSlot, Signal::kLanded, epoch);
  for (int p = 0; p < world_size(); ++p)
    if (p != rank()) handshake_.wait(caller, Handshake::kBarrierSlot, Signal::kLanded, p, epoch);
  join(comm_, caller);
  for (auto& entry : tags_) entry.second.deferred = false;
  std::ostringstream what;
  what << "rank " << rank() << ": barrier #" << epoch;
  watchdog_->watch(record(caller), what.str(), Handshake::kBarrierSlot, epoch);
}

void UlyssesGroup::quiesce() {
  c10::cuda::CUDAGuard guard(device_);
  FU_CUDA_CHECK(cudaStreamSynchronize(comm_));
  FU_CUDA_CHECK(cudaStreamSynchronize(c10::cuda::getCurrentCUDAStream(device_.index()).stream()));
  c10d::resolve_process_group(group_name_)->barrier()->wait();
}

std::vector<int64_t> UlyssesGroup::stats() const {
  int64_t deferred = 0;
  for (const auto& entry : tags_) deferred += entry.second.deferred ? 1 : 0;
  return {pool_.capacity(), pool_.used(), pool_.segments(), pool_.sealed() ? 1 : 0,
          static_cast<int64_t>(tags_.size()), deferred};
}

}  // namespace fast_ulysses::transport
