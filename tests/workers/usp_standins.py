"""The stand-ins tests/workers/usp_frameworks.py puts where a machine lacks what the frameworks'
rings assume, none of them on the Ulysses all-to-all path:
- CPU ranks: torch's `aten::_scaled_dot_product_flash_attention` and its backward have CUDA
  kernels only (diffusers' `_native_flash`, yunchang's TORCH_FLASH and xDiT's SDPA_FLASH call
  them, for the LSE their rings merge by); `register_cpu_flash` gives them a CPU kernel, torch's
  CPU flash attention (`_scaled_dot_product_flash_attention_for_cpu` and its backward).
- Ranks sharing a GPU talk over gloo (NCCL hangs with two ranks on one GPU), whose all_gather,
  permute and P2P crash the process on CUDA tensors (a memmove from device memory):
  `shared_gpu_shims` sends the rings' CUDA traffic (and diffusers' output gather) through host
  copies. On NCCL none of this is needed.
"""

from __future__ import annotations

import diffusers_patch as wan
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

_LIBRARY = []  # the torch.library registration, kept alive


def _cpu_flash(q, k, v, dropout_p=0.0, is_causal=False, return_debug_mask=False, *, scale=None):
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out, lse = op(q, k, v, dropout_p, is_causal, scale=scale)
    empty = q.new_empty(0)
    return out, lse, empty, empty, q.shape[2], k.shape[2], empty, empty, empty


def _cpu_flash_backward(g, q, k, v, out, lse, cq, ck, mq, mk, p, causal, s, o, *, scale=None):
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    return op(g, q, k, v, out, lse, p, causal, scale=scale)


def register_cpu_flash() -> None:
    """The CPU kernels of aten::_scaled_dot_product_flash_attention and its backward."""
    library = torch.library.Library("aten", "IMPL")
    library.impl("_scaled_dot_product_flash_attention", _cpu_flash, "CPU")
    library.impl("_scaled_dot_product_flash_attention_backward", _cpu_flash_backward, "CPU")
    _LIBRARY.append(library)


# -- what ranks sharing a GPU lack: the rings' CUDA traffic over gloo ---------------------------


class HostFuncol:
    """The functional collectives the rings use (diffusers' `funcol`, torch's ring's `ft_c`),
    with `all_gather_tensor` and `permute_tensor` on host copies: gloo's versions crash the
    process on CUDA tensors (a memmove from device memory). The rings' transport, not the
    Ulysses all-to-alls; on NCCL none of this is needed. Anything else is funcol's own."""

    def __getattr__(self, name):
        return getattr(funcol, name)

    @staticmethod
    def all_gather_tensor(tensor, gather_dim, group):
        out = funcol.all_gather_tensor(tensor.cpu(), gather_dim, group)
        return funcol.wait_tensor(out).to(tensor.device)

    @staticmethod
    def permute_tensor(tensor, src_dst, group):
        out = funcol.permute_tensor(tensor.cpu(), src_dst, group)
        return funcol.wait_tensor(out).to(tensor.device)


class HostStagedWork:
    """The works of one host-staged batch of P2P ops; wait() copies what arrived to the GPU."""

    def __init__(self, works, arrivals):
        self.works, self.arrivals = works, arrivals

    def wait(self) -> bool:
        for work in self.works:
            work.wait()
        for device_tensor, host in self.arrivals:
            device_tensor.copy_(host)
        return True


def host_staged_batch_isend_irecv(batch):
    """dist.batch_isend_irecv (yunchang's RingComm) with CUDA tensors sent and received through
    host copies, for the same reason as HostFuncol."""

    def batch_isend_irecv(ops):
        staged, arrivals = [], []
        for op in ops:
            tensor = op.tensor
            if tensor.is_cuda:
                host = tensor.detach().cpu()
                if op.op.__name__ == "irecv":
                    arrivals.append((tensor, host))
                op = dist.P2POp(op.op, host, op.peer, op.group, op.tag)
            staged.append(op)
        return [HostStagedWork(batch(staged), arrivals)]

    return batch_isend_irecv


def shared_gpu_shims() -> None:
    """Everything above, installed for the process (before any check runs)."""
    from diffusers.models import attention_dispatch
    from torch.distributed.tensor.experimental._context_parallel import _attention

    wan.gloo_cuda_gather_shim()
    attention_dispatch.funcol = _attention.ft_c = HostFuncol()
    dist.batch_isend_irecv = host_staged_batch_isend_irecv(dist.batch_isend_irecv)
