"""`ring_attention`: attention over a sequence split into blocks along a ring of ranks (the ring
half of Ulysses x Ring, "USP"), through torch.distributed point-to-point calls.

Each of the ring's R ranks holds q, k and v of its own sequence block (the same heads on every
rank). Forward: at step t a rank holds the k/v block of ring rank (r - t) mod R; the next block's
send/recv starts (`dist.batch_isend_irecv`) before the current block is attended, so the rotation
overlaps attention; block outputs merge by log-sum-exp in float32. Backward: k/v rotate again,
their dk/dv accumulators travel with them (one last shift returns each to its owner), dq stays
local; each block's gradients come from the block kernel's backward given the GLOBAL output and
LSE, which is the exact gradient of the whole attention.

The block kernels, which return (out, lse), are in ring_kernels.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import FastUlyssesError
from .ring_kernels import UserKernel, default_kernel

# -- grouped-query heads and empty blocks ----------------------------------------------------------


def _expand(t, ratio):
    """(b, h_kv, s, d) -> (b, h_kv * ratio, s, d): kv head c serves q heads c * ratio onwards
    (the block kernels take one head count; a copy per block, freed after it)."""
    if ratio == 1:
        return t
    b, h, s, d = t.shape
    return t.unsqueeze(2).expand(b, h, ratio, s, d).reshape(b, h * ratio, s, d)


def _reduce(t, ratio):
    """The inverse of `_expand` for gradients: each kv head's sum over the q heads it serves."""
    if ratio == 1:
        return t
    b, h, s, d = t.shape
    return t.view(b, h // ratio, ratio, s, d).sum(2)


def _empty(q, k):
    """Nothing to attend (no q rows, no heads or no keys): the kernels are not called (SDPA on
    zero heads dies of SIGFPE on the CPU); the block weighs nothing in the merge."""
    return 0 in q.shape or 0 in k.shape[1:3]


# -- the ring -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ring:
    """This rank's place in the ring: its index, the global ranks it sends to and receives
    from, every ring rank's k/v block length, and whether gloo carries CUDA tensors (through
    the host: gloo's send and recv take CPU tensors)."""

    group: object
    rank: int
    size: int
    send_to: int
    recv_from: int
    kv_lens: tuple
    staged: bool

    def block(self, t: int) -> int:
        """The ring rank whose k/v block this rank holds at step t."""
        return (self.rank - t) % self.size


def _ring(group, q, k, v, refusal: str = "") -> Ring:
    """The ring of `group` for q, k, v; gathers every ring rank's shapes (one all_gather) and
    refuses, on every rank alike, ranks that disagree on anything but sequence lengths, and
    every rank when any refused its own attn_fn result (`refusal`, its message)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    gloo = dist.get_backend(group) == "gloo"
    dev = torch.device("cpu") if gloo else q.device
    mine = [q.shape[0], q.shape[1], k.shape[1], q.shape[3], v.shape[3], q.shape[2], k.shape[2]]
    mine.append(_DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1)
    mine.append(int(bool(refusal)))
    meta = torch.tensor(mine, dtype=torch.int64, device=dev)
    every = [torch.empty_like(meta) for _ in range(size)]
    dist.all_gather(every, meta, group=group)
    rows = [t.tolist() for t in every]
    if refusal:
        raise FastUlyssesError(refusal)
    refused_by = [j for j, row in enumerate(rows) if row[8]]
    if refused_by:
        raise FastUlyssesError(
            f"ring_group: ring rank {refused_by[0]} refused what attn_fn returned for its first "
            "block (its error says why): every rank of the ring stops before anything is sent"
        )
    for j, row in enumerate(rows):
        if row[:5] != rows[0][:5] or row[7] != rows[0][7]:
            raise FastUlyssesError(
                f"ring_group: ring rank {j} holds (b, h_q, h_kv, d, d_v, dtype) = "
                f"{_describe(row)} but ring rank 0 holds {_describe(rows[0])}: every rank of a "
                "ring must hold the same batch, heads, head dims and dtype (the same Ulysses "
                "position and head_splits); only sequence lengths may differ"
            )
    return Ring(
        group=group,
        rank=rank,
        size=size,
        send_to=dist.get_global_rank(group, (rank + 1) % size),
        recv_from=dist.get_global_rank(group, (rank - 1) % size),
        kv_lens=tuple(row[6] for row in rows),
        staged=gloo and q.device.type != "cpu",
    )


_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _describe(row):
    dtype = _DTYPES[row[7]] if 0 <= row[7] < len(_DTYPES) else "other"
    return f"({row[0]}, {row[1]}, {row[2]}, {row[3]}, {row[4]}, {dtype})"


class _Shift:
    """One rotation step in flight: `tensors` go to the next ring rank while tensors shaped
    like them with `length` rows (dim 2) come from the previous one. `wait()` returns those."""

    def __init__(self, ring: Ring, tensors, length: int):
        self.device = tensors[0].device
        send = [t.cpu() if ring.staged else t.contiguous() for t in tensors]
        self.recv = [
            torch.empty((*t.shape[:2], length, *t.shape[3:]), dtype=t.dtype, device=s.device)
            for t, s in zip(tensors, send)
        ]
        ops = [
            dist.P2POp(dist.isend, s, ring.send_to, ring.group, tag=i)
            for i, s in enumerate(send)
            if s.numel()
        ]
        ops += [
            dist.P2POp(dist.irecv, r, ring.recv_from, ring.group, tag=i)
            for i, r in enumerate(self.recv)
            if r.numel()
        ]
        self.works = dist.batch_isend_irecv(ops) if ops else []
        self.send = send  # held until the sends complete

    def wait(self):
        for work in self.works:
            work.wait()
        return [r.to(self.device) if r.device != self.device else r for r in self.recv]


def _start(ring: Ring, kv, t: int):
    """Step t's rotation of kv (None after the last step)."""
    return _Shift(ring, kv, ring.kv_lens[ring.block(t + 1)]) if t + 1 < ring.size else None


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """The merge's and the gradients' dtype: float32, or float64 for float64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def _merge(out, lse, o_i, l_i):
    """Online log-sum-exp merge in out's dtype (an empty block's lse is -inf and weighs 0)."""
    new = torch.logaddexp(lse, l_i.to(lse.dtype))
    safe = torch.where(torch.isinf(new), torch.zeros_like(new), new)
    o_i = o_i.to(out.dtype)
    out = out * torch.exp(lse - safe).unsqueeze(-1) + o_i * torch.exp(l_i - safe).unsqueeze(-1)
    return out, new


def _forward(ring: Ring, kernel, q, k, v, scale, first=None):
    """The forward; `first`: this rank's own block's (out, lse), attended already (a user's
    kernel, checked before anything was sent), or None."""
    b, h, s, _ = q.shape
    ratio = h // k.shape[1] if k.shape[1] else 1
    acc = accumulation_dtype(q.dtype)
    out = torch.zeros((b, h, s, v.shape[3]), dtype=acc, device=q.device)
    lse = torch.full((b, h, s), float("-inf"), dtype=acc, device=q.device)
    kv = [k, v]
    for t in range(ring.size):
        pending = _start(ring, kv, t)
        if t == 0 and first is not None:
            out, lse = _merge(out, lse, *first)
        elif not _empty(q, kv[0]):
            o_i, l_i = kernel.forward(q, _expand(kv[0], ratio), _expand(kv[1], ratio), scale)
            out, lse = _merge(out, lse, o_i, l_i)
        if pending is not None:
            kv = pending.wait()
    return out.to(q.dtype), lse


def _first_block(kernel, q, k, v, needs_grad: bool):
    """A user's kernel on this rank's own block, before anything is sent: (out, lse) or None
    (nothing to attend), and its refusal's message ("" for none). With gradients to come, the
    block runs with grad enabled once, to check that its lse is differentiable."""
    if not kernel.check_first or _empty(q, k):
        return None, ""
    ratio = q.shape[1] // k.shape[1]
    try:
        with torch.enable_grad() if needs_grad else torch.no_grad():
            inputs = [t.detach().requires_grad_(needs_grad) for t in (q, k, v)]
            o, lse = kernel.checked(inputs[0], _expand(inputs[1], ratio), _expand(inputs[2], ratio))
        if needs_grad:
            kernel.check_differentiable(lse)
    except FastUlyssesError as error:
        return None, str(error)
    return (o.detach(), lse.detach()), ""


def _backward(ring: Ring, kernel, dout, q, k, v, out, lse, scale):
    ratio = q.shape[1] // k.shape[1] if k.shape[1] else 1
    dtype = accumulation_dtype(q.dtype)
    dq = torch.zeros(q.shape, dtype=dtype, device=q.device)
    acc = [torch.zeros(t.shape, dtype=dtype, device=t.device) for t in (k, v)]
    kv, acc_in = [k, v], None
    for t in range(ring.size):
        nxt = ring.kv_lens[ring.block(t + 1)]
        first = t == 0 and kernel.check_first
        kv_in = None if first else _start(ring, kv, t)
        grads = None
        if not _empty(q, kv[0]):
            grads = kernel.backward(
                dout, q, _expand(kv[0], ratio), _expand(kv[1], ratio), out, lse, scale
            )
        if first:
            kv_in = _start(ring, kv, t)
        if acc_in is not None:
            acc = acc_in.wait()
        if grads is not None:
            dq += grads[0].to(dtype)
            acc = [a + _reduce(g.to(dtype), ratio) for a, g in zip(acc, grads[1:])]
        # The accumulators follow their block to the next rank; after the last step one more
        # shift brings each home.
        if ring.size > 1:
            acc_in = _Shift(ring, acc, nxt)
        if kv_in is not None:
            kv = kv_in.wait()
    if acc_in is not None:
        acc = acc_in.wait()
    return dq.to(q.dtype), acc[0].to(k.dtype), acc[1].to(v.dtype)


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ring, kernel, scale, first):
        out, lse = _forward(ring, kernel, q, k, v, scale, first)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ring, ctx.kernel, ctx.scale = ring, kernel, scale
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable  # (double backward: a clear error)
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = _backward(
            ctx.ring, ctx.kernel, dout.contiguous(), q, k, v, out, lse, ctx.scale
        )
        return dq, dk, dv, None, None, None, None


class _LocalRing:
    """A ring of one rank (no group, or a group of size 1): no calls."""

    rank, size, group, staged = 0, 1, None, False

    def __init__(self, k):
        self.kv_lens = (k.shape[2],)

    def block(self, t):
        return 0


@torch.compiler.disable  # eager: point-to-point calls and a host-side gather of block lengths
def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ring_group=None,
    *,
    attn_fn: Callable | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of this rank's q over the k and v of every rank of `ring_group`.

    Arguments:
        q: (b, h, s_q, d), this rank's heads and its block of the sequence.
        k, v: (b, h_kv, s_kv, d) and (b, h_kv, s_kv, d_v), this rank's k/v block; s_kv may
            differ from s_q and between ring ranks; h a multiple of h_kv (grouped-query: q head
            i uses kv head i // (h // h_kv)).
        ring_group: a torch ProcessGroup (gloo or NCCL) or None (no ring: this rank only).
            Every ring rank must hold the same b, heads, head dims and dtype (checked).
        attn_fn: None (aten's flash kernel on the CPU, its memory-efficient one on CUDA, an
            explicit float32 one otherwise), or `attn_fn(q, k, v) -> (out, lse)` on one block
            (k and v with q's head count; lse (b, h, s_q), differentiable for backward).
        scale: the scores' scale (default 1 / sqrt(d)).

    Returns:
        (b, h, s_q, d_v), q's dtype; differentiable with respect to q, k and v.

    Raises:
        FastUlyssesError naming the argument and the rule (checked before anything is sent;
        ring ranks whose shapes disagree are refused on every rank after the one all_gather).

    Under torch.compile it runs eagerly (a graph break), as do its calls.
    """
    _check(q, k, v, ring_group, attn_fn, scale)
    kernel = default_kernel(q, v) if attn_fn is None else UserKernel(attn_fn)
    size = 1 if ring_group is None else dist.get_world_size(ring_group)
    q, k, v = (t.contiguous() for t in (q, k, v))
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    first, refusal = _first_block(kernel, q, k, v, needs_grad)
    if size == 1 and refusal:
        raise FastUlyssesError(refusal)
    ring = _LocalRing(k) if size == 1 else _ring(ring_group, q, k, v, refusal)
    scale = q.shape[3] ** -0.5 if scale is None else float(scale)
    return _RingAttention.apply(q, k, v, ring, kernel, scale, first)


def _check(q, k, v, ring_group, attn_fn, scale) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            what = f"shape {tuple(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
            raise FastUlyssesError(f"{name} is {what}: it must be a 4-d (b, h, s, d) tensor")
        if t.dtype != q.dtype or t.device != q.device:
            raise FastUlyssesError(
                f"{name} is {t.dtype} on {t.device} but q is {q.dtype} on {q.device}: q, k "
                "and v must have one dtype and device"
            )
    if k.shape[:3] != v.shape[:3] or k.shape[0] != q.shape[0] or k.shape[3] != q.shape[3]:
        raise FastUlyssesError(
            f"k has shape {tuple(k.shape)}, v {tuple(v.shape)}, q {tuple(q.shape)}: k and v "
            "must share b, h_kv and s_kv, and k q's b and head dim"
        )
    if k.shape[1] == 0 and q.shape[1] or k.shape[1] and q.shape[1] % k.shape[1]:
        raise FastUlyssesError(
            f"k has {k.shape[1]} heads but q has {q.shape[1]}: q's head count must be a "
            "multiple of k's and v's (grouped-query attention)"
        )
    if ring_group is not None and not isinstance(ring_group, dist.ProcessGroup):
        raise FastUlyssesError(
            f"ring_group is a {type(ring_group).__name__}: it must be a torch.distributed "
            "ProcessGroup or None"
        )
    if attn_fn is not None and not callable(attn_fn):
        raise FastUlyssesError(
            f"attn_fn is {attn_fn!r}: it must be a callable attn_fn(q, k, v) -> (out, lse), or None"
        )
    if q.shape[3] == 0:
        raise FastUlyssesError(
            f"q has shape {tuple(q.shape)}: its head dim (dim 3) must be at least 1"
        )
    if attn_fn is not None and scale is not None:
        raise FastUlyssesError(
            f"scale={scale!r} with an attn_fn: attn_fn applies its own scale (it computes the "
            "scores); pass scale only without attn_fn"
        )
    if scale is not None and not isinstance(scale, (int, float)):
        raise FastUlyssesError(f"scale is {scale!r}: it must be a float or None (1 / sqrt(d))")
