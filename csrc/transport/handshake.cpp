#include "transport/handshake.h"

#include <algorithm>

#include "transport/cuda_check.h"
#include "transport/driver_api.h"

namespace fast_ulysses::transport {
namespace {

// cuStreamBatchMemOp takes fewer than 256 operations per call.
constexpr size_t kMaxOpsPerCall = 255;

}  // namespace

void MemOpBatch::write(char* address, uint64_t value, bool wide) {
  CUstreamBatchMemOpParams op = {};
  op.writeValue.operation =
      wide ? CU_STREAM_MEM_OP_WRITE_VALUE_64 : CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op.writeValue.address = reinterpret_cast<CUdeviceptr>(address);
  if (wide) {
    op.writeValue.value64 = value;
  } else {
    op.writeValue.value = static_cast<uint32_t>(value);
  }
  // The default flag keeps the memory fence: everything issued before on the stream (a copy
  // into the peer's window, a wait) is visible to whoever sees the new value.
  op.writeValue.flags = CU_STREAM_WRITE_VALUE_DEFAULT;
  ops_.push_back(op);
}

void MemOpBatch::wait_equal(char* address, uint64_t value, bool wide) {
  CUstreamBatchMemOpParams op = {};
  op.waitValue.operation = wide ? CU_STREAM_MEM_OP_WAIT_VALUE_64 : CU_STREAM_MEM_OP_WAIT_VALUE_32;
  op.waitValue.address = reinterpret_cast<CUdeviceptr>(address);
  if (wide) {
    op.waitValue.value64 = value;
  } else {
    op.waitValue.value = static_cast<uint32_t>(value);
  }
  op.waitValue.flags = CU_STREAM_WAIT_VALUE_EQ;
  ops_.push_back(op);
}

void MemOpBatch::issue(cudaStream_t stream) {
  const auto& api = DriverApi::get();
  CUresult result = CUDA_SUCCESS;
  for (size_t first = 0; first < ops_.size() && result == CUDA_SUCCESS; first += kMaxOpsPerCall) {
    const auto count = static_cast<unsigned int>(std::min(kMaxOpsPerCall, ops_.size() - first));
    result =
        api.stream_batch_mem_op(reinterpret_cast<CUstream>(stream), count, ops_.data() + first, 0);
  }
  ops_.clear();  // also on failure: a later call must never re-issue these operations
  FU_CU_CHECK(result);
}

uint32_t Handshake::initial_value(int slot, Word word) {
  // kHeld = 1 in every tag slot (not the barrier slot, whose kBarrierA shares kHeld's index).
  return slot < kMaxTags && word == Word::kHeld ? 1 : 0;
}

std::vector<uint32_t> Handshake::initial_header() {
  std::vector<uint32_t> words(kHeaderBytes / 4, 0);
  for (int slot = 0; slot <= kMaxTags; ++slot)
    for (int w = 0; w < kWords; ++w)
      for (int p = 0; p < kMaxRanks; ++p)
        words[offset(slot, static_cast<Word>(w), p) / 4] =
            initial_value(slot, static_cast<Word>(w));
  return words;
}

Handshake::Handshake(int rank, std::vector<char*> headers, bool wide)
    : rank_(rank), headers_(std::move(headers)), wide_(wide) {
  TORCH_CHECK(static_cast<int>(headers_.size()) <= kMaxRanks, "fast-ulysses: ", headers_.size(),
              " ranks: at most ", kMaxRanks);
  // Word pairs start at an even rank index of an 8-byte aligned header.
  static_assert(kMaxRanks % 2 == 0, "a slot's words come in pairs");
  TORCH_CHECK(!wide_ || reinterpret_cast<uintptr_t>(headers_[rank_]) % 8 == 0,
              "fast-ulysses: the signal header is not 8-byte aligned");
  groups_ = flag_groups(world_size(), rank_, wide_);
}

void Handshake::wait_peers(MemOpBatch& batch, int slot, Word word, uint32_t value) const {
  const uint32_t idle = initial_value(slot, word);
  for (const FlagGroup& group : groups_)
    batch.wait_equal(mine(slot, word, group.first), group.value(value, idle), group.wide);
}

void Handshake::set_peers(MemOpBatch& batch, int slot, Word word, uint32_t value) const {
  const uint32_t idle = initial_value(slot, word);
  for (const FlagGroup& group : groups_)
    batch.write(mine(slot, word, group.first), group.value(value, idle), group.wide);
}

int64_t Handshake::offset(int slot, Word word, int rank) {
  return ((int64_t{slot} * kWords + static_cast<int>(word)) * kMaxRanks + rank) * 4;
}

char* Handshake::mine(int slot, Word word, int from) const {
  return headers_[rank_] + offset(slot, word, from);
}

char* Handshake::theirs(int to, int slot, Word word) const {
  return headers_[to] + offset(slot, word, rank_);
}

bool Handshake::read_word(const char* word, uint32_t* value) {
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return false;
  uint32_t read = 0;
  const bool ok =
      cudaMemcpyAsync(&read, word, sizeof(read), cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
      cudaStreamSynchronize(stream) == cudaSuccess;
  cudaStreamDestroy(stream);
  if (ok) *value = read;
  return ok;
}

}  // namespace fast_ulysses::transport
