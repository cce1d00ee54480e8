#include "transport/handshake.h"

#include "transport/cuda_check.h"
#include "transport/driver_api.h"

namespace fast_ulysses::transport {

Handshake::Handshake(int rank, std::vector<char*> headers)
    : rank_(rank), headers_(std::move(headers)) {
  TORCH_CHECK(static_cast<int>(headers_.size()) <= kMaxRanks, "fast-ulysses: ",
              headers_.size(), " ranks: at most ", kMaxRanks);
}

int64_t Handshake::offset(int slot, Signal signal, int rank) {
  return ((int64_t{slot} * 2 + static_cast<int>(signal)) * kMaxRanks + rank) * 8;
}

void Handshake::signal(cudaStream_t stream, int to_rank, int slot, Signal signal,
                       uint64_t epoch) const {
  const auto address =
      reinterpret_cast<CUdeviceptr>(headers_[to_rank] + offset(slot, signal, rank_));
  // CU_STREAM_WRITE_VALUE_DEFAULT keeps the fence that orders earlier copies before the write.
  FU_CU_CHECK(DriverApi::get().stream_write_value64(reinterpret_cast<CUstream>(stream), address,
                                                    epoch, CU_STREAM_WRITE_VALUE_DEFAULT));
}

void Handshake::wait(cudaStream_t stream, int slot, Signal signal, int from_rank,
                     uint64_t epoch) const {
  const auto address =
      reinterpret_cast<CUdeviceptr>(headers_[rank_] + offset(slot, signal, from_rank));
  FU_CU_CHECK(DriverApi::get().stream_wait_value64(reinterpret_cast<CUstream>(stream), address,
                                                   epoch, CU_STREAM_WAIT_VALUE_GEQ));
}

uint64_t Handshake::read(int slot, Signal signal, int from_rank) const {
  uint64_t value = 0;
  cudaStream_t stream = nullptr;
  FU_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const char* address = headers_[rank_] + offset(slot, signal, from_rank);
  const cudaError_t copied =
      cudaMemcpyAsync(&value, address, sizeof(value), cudaMemcpyDeviceToHost, stream);
  const cudaError_t synced = cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  FU_CUDA_CHECK(copied);
  FU_CUDA_CHECK(synced);
  return value;
}

}  // namespace fast_ulysses::transport
