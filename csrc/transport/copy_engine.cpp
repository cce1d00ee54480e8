#include "transport/copy_engine.h"

#include <ATen/ATen.h>
#include <cuda_runtime.h>

#include "transport/cuda_check.h"

namespace fast_ulysses::transport {

void issue_copy(const CopyDescriptor& descriptor, const char* src, char* dst,
                cudaStream_t stream) {
  if (descriptor.bytes() == 0) return;
  const CopyDescriptor c = coalesced(descriptor);
  const char* s = src + c.src_offset;
  char* d = dst + c.dst_offset;
  if (c.height == 1 && c.depth == 1) {
    FU_CUDA_CHECK(cudaMemcpyAsync(d, s, c.width, cudaMemcpyDeviceToDevice, stream));
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

// One 3D batch op for a coalesced descriptor, or false where the geometry does not fit one
// (a slice pitch that is not whole rows of the pitch).
bool batch_op(const CopyDescriptor& c, const char* src, char* dst, cudaMemcpy3DBatchOp& op) {
  if (c.src_slice_pitch % c.src_pitch != 0 || c.dst_slice_pitch % c.dst_pitch != 0) return false;
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

void copy_local(const CopyDescriptor& descriptor, const at::Tensor& x, const at::Tensor& window) {
  if (descriptor.bytes() == 0) return;
  const CopyDescriptor c = coalesced(descriptor);
  const int64_t es = x.element_size();  // every plan offset and pitch is whole elements
  const std::vector<int64_t> sizes = {c.depth, c.height, c.width / es};
  const at::Tensor src = x.as_strided(sizes, {c.src_slice_pitch / es, c.src_pitch / es, 1},
                                      x.storage_offset() + c.src_offset / es);
  at::Tensor dst = window.as_strided(sizes, {c.dst_slice_pitch / es, c.dst_pitch / es, 1},
                                     window.storage_offset() + c.dst_offset / es);
  dst.copy_(src);
}

}  // namespace fast_ulysses::transport
