#include "transport/copy_engine.h"

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/pitched_copy.h"
#include "transport/cuda_check.h"

namespace fast_ulysses::transport {
namespace {

// Rows of any byte width. The CUDA driver API documents, for cuMemcpy2D, that "on intra-device
// memory copies (device to device, CUDA array to device, CUDA array to CUDA array), cuMemcpy2D()
// may fail for pitches not computed by cuMemAllocPitch()", and that cuMemcpy2DUnaligned(), which
// lifts the restriction, has no asynchronous (stream or graph) form. The runtime calls used here
// (cudaMemcpy2DAsync, cudaMemcpy3DAsync, cudaMemcpy3DBatchAsync) document no alignment rule but
// promise none either, and the plan's windows are not cuMemAllocPitch pitches. So a pitched
// copy goes to those calls only where every pitch, the width and both addresses are multiples
// of kCopyEngineAlignment (16 bytes: every row of d * element_size a multiple of 16, the geometry
// measured on the H200); a 1D copy (cudaMemcpyAsync) has no pitch and always goes. Anything else
// is copied by our pitched copy kernel through the mapped peer address (copy_by_kernel: an SM
// kernel, any geometry, capturable): correct at any width, at SM speed.
bool copy_engine_aligned(const CopyDescriptor& c, const char* s, const char* d) {
  const auto aligned = [](uint64_t v) { return v % kCopyEngineAlignment == 0; };
  return aligned(c.width) && aligned(c.src_pitch) && aligned(c.dst_pitch) &&
         aligned(c.src_slice_pitch) && aligned(c.dst_slice_pitch) &&
         aligned(reinterpret_cast<uintptr_t>(s)) && aligned(reinterpret_cast<uintptr_t>(d));
}

}  // namespace

void issue_copy(const CopyDescriptor& descriptor, const char* src, char* dst, cudaStream_t stream) {
  if (descriptor.bytes() == 0) return;
  const CopyDescriptor c = coalesced(descriptor);
  const char* s = src + c.src_offset;
  char* d = dst + c.dst_offset;
  if (c.height == 1 && c.depth == 1) {
    FU_CUDA_CHECK(cudaMemcpyAsync(d, s, c.width, cudaMemcpyDeviceToDevice, stream));
    return;
  }
  if (!copy_engine_aligned(c, s, d)) {
    copy_by_kernel(c, src, dst, stream);
    return;
  }
  if (c.depth == 1) {
    FU_CUDA_CHECK(cudaMemcpy2DAsync(d, c.dst_pitch, s, c.src_pitch, c.width, c.height,
                                    cudaMemcpyDeviceToDevice, stream));
    return;
  }
  // A 3D copy of linear memory: each side's slice pitch must be whole rows of its pitch,
  // which holds for every plan (slices are b, rows are tokens); otherwise one 2D copy a slice.
  if (c.src_slice_pitch % c.src_pitch == 0 && c.dst_slice_pitch % c.dst_pitch == 0) {
    cudaMemcpy3DParms params = {};
    params.srcPtr = make_cudaPitchedPtr(const_cast<char*>(s), c.src_pitch, c.width,
                                        c.src_slice_pitch / c.src_pitch);
    params.dstPtr = make_cudaPitchedPtr(d, c.dst_pitch, c.width, c.dst_slice_pitch / c.dst_pitch);
    params.extent = make_cudaExtent(c.width, c.height, c.depth);
    params.kind = cudaMemcpyDeviceToDevice;
    FU_CUDA_CHECK(cudaMemcpy3DAsync(&params, stream));
    return;
  }
  for (int64_t z = 0; z < c.depth; ++z)
    FU_CUDA_CHECK(cudaMemcpy2DAsync(d + z * c.dst_slice_pitch, c.dst_pitch,
                                    s + z * c.src_slice_pitch, c.src_pitch, c.width, c.height,
                                    cudaMemcpyDeviceToDevice, stream));
}

namespace {

// One 3D batch op for a coalesced descriptor, or false where the geometry does not fit one (a
// slice pitch that is not whole rows of the pitch, or rows the pitched calls are not given: see
// copy_engine_aligned).
bool batch_op(const CopyDescriptor& c, const char* src, char* dst, cudaMemcpy3DBatchOp& op) {
  if (c.src_slice_pitch % c.src_pitch != 0 || c.dst_slice_pitch % c.dst_pitch != 0) return false;
  if (!(c.height == 1 && c.depth == 1) &&
      !copy_engine_aligned(c, src + c.src_offset, dst + c.dst_offset))
    return false;
  op = {};
  op.src.type = cudaMemcpyOperandTypePointer;
  op.src.op.ptr.ptr = const_cast<char*>(src + c.src_offset);
  op.src.op.ptr.rowLength = static_cast<size_t>(c.src_pitch);  // elements of 1 byte
  op.src.op.ptr.layerHeight = static_cast<size_t>(c.src_slice_pitch / c.src_pitch);
  op.dst.type = cudaMemcpyOperandTypePointer;
  op.dst.op.ptr.ptr = dst + c.dst_offset;
  op.dst.op.ptr.rowLength = static_cast<size_t>(c.dst_pitch);
  op.dst.op.ptr.layerHeight = static_cast<size_t>(c.dst_slice_pitch / c.dst_pitch);
  op.extent = make_cudaExtent(c.width, c.height, c.depth);
  op.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
  op.flags = cudaMemcpyFlagPreferOverlapWithCompute;
  return true;
}

// Set once a batch was refused: this process then issues one call per copy.
bool batch_refused = false;

}  // namespace

void issue_copies(const std::vector<PeerCopy>& copies, cudaStream_t stream, bool batch) {
  if (batch && !batch_refused && copies.size() > 1) {
    std::vector<cudaMemcpy3DBatchOp> ops;
    ops.reserve(copies.size());
    bool fits = true;
    for (const PeerCopy& pc : copies) {
      if (pc.copy->bytes() == 0) continue;
      cudaMemcpy3DBatchOp op;
      fits = fits && batch_op(coalesced(*pc.copy), pc.src, pc.dst, op);
      ops.push_back(op);
    }
    if (fits && ops.empty()) return;
    if (fits) {
      const cudaError_t status = cudaMemcpy3DBatchAsync(ops.size(), ops.data(), 0, stream);
      if (status == cudaSuccess) return;
      // A refusal enqueues nothing: clear it and issue the copies one by one from now on.
      (void)cudaGetLastError();
      batch_refused = true;
    }
  }
  for (const PeerCopy& pc : copies) issue_copy(*pc.copy, pc.src, pc.dst, stream);
}

void copy_by_kernel(const CopyDescriptor& descriptor, const char* src, char* dst,
                    cudaStream_t stream) {
  if (descriptor.bytes() == 0) return;
  FU_CUDA_CHECK(kernels::launch_pitched_copy(coalesced(descriptor), src, dst, stream));
}

}  // namespace fast_ulysses::transport
