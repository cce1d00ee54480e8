"""The block kernels of `fast_ulysses.ring_attention`: each attends (b, h, s, d) q to one k/v
block of q's head count and returns (out, lse), lse float32 (b, h, s_q); its backward takes the
output gradient with the GLOBAL out and lse (over every block), which makes a flash backward
return that block's exact share of the gradient.

- `MathKernel`: explicit matmul + logsumexp in float32 (any device, dtype, head dims): the
  reference the tests check the others against, and the fallback.
- `CpuFlashKernel`, `CudaEfficientKernel`: aten's fused kernels (`default_kernel` picks).
- `UserKernel`: a user's `attn_fn(q, k, v) -> (out, lse)`; its backward recomputes the block.
"""

from __future__ import annotations

import torch

from .errors import FastUlyssesError


class MathKernel:
    """Explicit matmul + logsumexp in float32 (float64 for float64 inputs): any device, dtype
    and head dims."""

    name = "math"
    check_first = False

    @staticmethod
    def forward(q, k, v, scale):
        acc = torch.promote_types(q.dtype, torch.float32)
        s = torch.matmul(q.to(acc), k.to(acc).transpose(-1, -2)) * scale
        lse = torch.logsumexp(s, dim=-1)
        out = torch.matmul(torch.exp(s - lse.unsqueeze(-1)), v.to(acc))
        return out.to(q.dtype), lse

    @staticmethod
    def backward(dout, q, k, v, out, lse, scale):
        acc = torch.promote_types(q.dtype, torch.float32)
        qf, kf, vf, do = q.to(acc), k.to(acc), v.to(acc), dout.to(acc)
        p = torch.exp(torch.matmul(qf, kf.transpose(-1, -2)) * scale - lse.to(acc).unsqueeze(-1))
        dv = torch.matmul(p.transpose(-1, -2), do)
        delta = (do * out.to(acc)).sum(-1, keepdim=True)
        ds = p * (torch.matmul(do, vf.transpose(-1, -2)) - delta)
        return torch.matmul(ds, kf) * scale, torch.matmul(ds.transpose(-1, -2), qf) * scale, dv


class CpuFlashKernel:
    """aten's CPU flash attention (float32, bfloat16, float16; v's head dim = q's)."""

    name = "cpu_flash"
    check_first = False

    @staticmethod
    def forward(q, k, v, scale):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=None, scale=scale
        )

    @staticmethod
    def backward(dout, q, k, v, out, lse, scale):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            dout.to(q.dtype), q, k, v, out, lse, 0.0, False, attn_mask=None, scale=scale
        )


class CudaEfficientKernel:
    """aten's CUDA memory-efficient attention (float32, bfloat16, float16). Its LSE is padded
    along s to a multiple of 32: cut on the way out, padded again for the backward."""

    name = "cuda_efficient"
    check_first = False

    @staticmethod
    def forward(q, k, v, scale):
        out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, 0.0, False, scale=scale
        )
        return out, lse[..., : q.shape[2]].float()

    @staticmethod
    def backward(dout, q, k, v, out, lse, scale):
        pad = -q.shape[2] % 32
        lse = torch.nn.functional.pad(lse, (0, pad)).contiguous()
        unused = torch.zeros((), dtype=torch.int64, device=q.device)  # philox: no dropout
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            dout.to(q.dtype), q, k, v, None, out, lse, unused, unused, 0.0,
            [True, True, True, False], False, scale=scale,
        )  # fmt: skip
        return dq, dk, dv


def default_kernel(q, v):
    """The block kernel `attn_fn=None` uses for q and v (checked, same dtype and device)."""
    cuda_types = (torch.float32, torch.bfloat16, torch.float16)
    if q.device.type == "cuda" and q.dtype in cuda_types and q.shape[3] % 8 == v.shape[3] % 8 == 0:
        return CudaEfficientKernel  # (head dims of 8n: aligned for every dtype)
    cpu_types = (torch.float32, torch.bfloat16, torch.float16)  # (float64's LSE is float64)
    if q.device.type == "cpu" and q.dtype in cpu_types and q.shape[3] == v.shape[3]:
        return CpuFlashKernel
    return MathKernel


class UserKernel:
    """A user's `attn_fn(q, k, v) -> (out, lse)`; its backward recomputes the block."""

    name = "attn_fn"
    check_first = True

    def __init__(self, attn_fn):
        self.attn_fn = attn_fn

    def forward(self, q, k, v, scale):
        """(`scale` is attn_fn's own business: ring_attention refuses one with attn_fn.)"""
        with torch.no_grad():
            return self.checked(q, k, v)

    def backward(self, dout, q, k, v, out, lse, scale):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        with torch.enable_grad():
            o_i, l_i = self.checked(q, k, v)
        self.check_differentiable(l_i)
        acc = lse.dtype
        w = torch.exp(l_i.detach().to(acc) - lse)
        do = dout.to(acc)
        grad_o = (w.unsqueeze(-1) * do).to(o_i.dtype)
        rows = (do * o_i.detach().to(acc)).sum(-1) - (do * out.to(acc)).sum(-1)
        grad_l = (w * rows).to(l_i.dtype)
        grads = torch.autograd.grad((o_i, l_i), (q, k, v), (grad_o, grad_l), allow_unused=True)
        return [torch.zeros_like(t) if g is None else g for g, t in zip(grads, (q, k, v))]

    @staticmethod
    def check_differentiable(lse) -> None:
        """Refuses an lse that autograd cannot differentiate (computed with grad enabled)."""
        if not lse.requires_grad:
            raise FastUlyssesError(
                "attn_fn's lse does not require grad: with a ring group, attn_fn(q, k, v) -> "
                "(out, lse) must return an lse autograd can differentiate (the merge of ring "
                "blocks depends on it)"
            )

    def checked(self, q, k, v):
        """attn_fn(q, k, v), checked: (out, lse) of the shapes the merge needs."""
        got = self.attn_fn(q, k, v)
        want_o, want_l = (*q.shape[:3], v.shape[3]), tuple(q.shape[:3])
        if (
            isinstance(got, (tuple, list))
            and len(got) == 2
            and all(isinstance(t, torch.Tensor) for t in got)
            and tuple(got[0].shape) == want_o
            and tuple(got[1].shape) == want_l
        ):
            return got
        if isinstance(got, torch.Tensor):
            what = f"a tensor of shape {tuple(got.shape)}"
        elif isinstance(got, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in got):
            what = f"tensors of shapes {[tuple(t.shape) for t in got]}"
        else:
            what = f"a {type(got).__name__}"
        raise FastUlyssesError(
            f"attn_fn returned {what} for q of shape {tuple(q.shape)}: with a ring group it must "
            f"return (out, lse), out of shape (b, h, S, d_v) = {want_o} and lse of shape "
            f"(b, h, S) = {want_l} (the log-sum-exp of each row's scores)"
        )
