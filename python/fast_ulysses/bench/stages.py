"""What one benchmark case times, stage by stage, on one rank.

Baseline (what yunchang / DeepSpeed-Ulysses do): permute + contiguous, `all_to_all_single` with
split sizes, permute + contiguous; and the raw `all_to_all_single` alone on the already permuted
buffer. fast-ulysses: the copy and borrowed entry points; the own-share relayout alone (torch
`copy_` of the same strided chunk on this GPU); GEMM-chain overlap; host CPU per call.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import plan as make_plan
from .timing import host_us, median_ms, overlap


@dataclass
class Case:
    name: str
    batch: int
    seq_splits: list
    head_splits: list
    head_dim: int
    dtype: torch.dtype

    def input_shape(self, rank: int, mode: int) -> tuple:
        if mode == 0:
            return (self.batch, self.seq_splits[rank], sum(self.head_splits), self.head_dim)
        return (self.batch, sum(self.seq_splits), self.head_splits[rank], self.head_dim)

    def kwargs(self) -> dict:
        return dict(seq_splits=list(self.seq_splits), head_splits=list(self.head_splits))


class Baseline:
    """permute -> contiguous -> all_to_all_single -> permute -> contiguous, any splits."""

    def __init__(self, group: dist.ProcessGroup, case: Case, mode: int, rank: int):
        self.group, self.case, self.mode, self.rank = group, case, mode, rank
        P = len(case.seq_splits)
        seq, heads = case.seq_splits, case.head_splits
        b, d = case.batch, case.head_dim
        # Mode 0: send heads_of(j) of my rows; receive my heads of rows_of(i).
        unit_in = b * d * (seq[rank] if mode == 0 else heads[rank])
        unit_out = b * d * (heads[rank] if mode == 0 else seq[rank])
        by = heads if mode == 0 else seq
        frm = seq if mode == 0 else heads
        self.in_splits = [by[j] * unit_in for j in range(P)]
        self.out_splits = [frm[i] * unit_out for i in range(P)]

    def permute_in(self, x: torch.Tensor) -> torch.Tensor:
        # (b, s, N, d) -> (N, b, s, d) for mode 0 (split by head); mode 1 (b, S, h, d) ->
        # (S, b, h, d) (split by row).
        return (x.permute(2, 0, 1, 3) if self.mode == 0 else x.permute(1, 0, 2, 3)).contiguous()

    def exchange(self, flat: torch.Tensor) -> torch.Tensor:
        out = torch.empty(sum(self.out_splits), dtype=flat.dtype, device=flat.device)
        dist.all_to_all_single(out, flat.view(-1), self.out_splits, self.in_splits,
                               group=self.group)
        return out

    def permute_out(self, received: torch.Tensor) -> torch.Tensor:
        c, r = self.case, self.rank
        b, d = c.batch, c.head_dim
        if self.mode == 0:  # blocks by source rank: (S rows as [i][b][s_i]) x h x d
            parts = torch.split(received, self.out_splits)
            views = [p.view(c.head_splits[r], b, c.seq_splits[i], d).permute(1, 2, 0, 3)
                     for i, p in enumerate(parts)]
            return torch.cat(views, dim=1)
        parts = torch.split(received, self.out_splits)  # (s_r, b, h_i, d) per source
        views = [p.view(c.seq_splits[r], b, c.head_splits[i], d).permute(1, 0, 2, 3)
                 for i, p in enumerate(parts)]
        return torch.cat(views, dim=2)

    def full(self, x: torch.Tensor) -> torch.Tensor:
        return self.permute_out(self.exchange(self.permute_in(x)))


def own_share_copy(case: Case, mode: int, rank: int, x: torch.Tensor):
    """The relayout of this rank's own share, as a torch copy_ of the same strided chunk."""
    p = make_plan(len(case.seq_splits), rank, mode, x.shape, x.dtype, **case.kwargs())
    out = torch.empty(p.output_shape, dtype=x.dtype, device=x.device)
    heads0 = sum(case.head_splits[:rank])
    rows0 = sum(case.seq_splits[:rank])
    if mode == 0:
        src = x[:, :, heads0:heads0 + case.head_splits[rank]]
        dst = out[:, rows0:rows0 + case.seq_splits[rank]]
    else:
        src = x[:, rows0:rows0 + case.seq_splits[rank]]
        dst = out[:, :, heads0:heads0 + case.head_splits[rank]]
    return lambda: dst.copy_(src)


def gemm_chain(device, size: int, count: int):
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    w = torch.randn(size, size, dtype=torch.bfloat16, device=device) / size ** 0.5

    def run():
        y = a
        for _ in range(count):
            y = y @ w
        return y
    return run


def _wait(t):
    return t.wait() if hasattr(t, "wait") else t


def run_case(case: Case, mode: int, ctx) -> dict:
    """Times every stage of one (case, mode) on this rank; numbers in ms, host in us.
    `ctx` has: rank, fast (UlyssesGroup), baseline_group (None when it cannot run),
    baseline_note, iters, warmup, gemms (callable or None)."""
    x = (torch.randn(case.input_shape(ctx.rank, mode), device=ctx.device) * 2).to(case.dtype)
    kw = case.kwargs()
    tag = f"{case.name}-{mode}"
    fast = ctx.fast
    copy = lambda: _wait(fast.all_to_all_single_4d(x, mode, tag, **kw))  # noqa: E731
    borrowed = lambda: fast.all_to_all_single_4d_borrowed(x, mode, tag + "-b", **kw)  # noqa: E731
    r = {"bytes_in": x.numel() * x.element_size()}
    it, wu = ctx.iters, ctx.warmup
    r["fast_copy_ms"] = median_ms(copy, it, wu)
    r["fast_borrowed_ms"] = median_ms(borrowed, it, wu)
    r["own_share_ms"] = median_ms(own_share_copy(case, mode, ctx.rank, x), it, wu)
    r["fast_copy_host_us"] = host_us(copy, it)
    r["fast_borrowed_host_us"] = host_us(borrowed, it)
    if ctx.gemms is not None:
        r["fast_overlap"] = overlap(ctx.gemms, copy, max(5, it // 4), 2)
    if ctx.baseline_group is None:
        return r
    base = Baseline(ctx.baseline_group, case, mode, ctx.rank)
    permuted = base.permute_in(x)
    received = base.exchange(permuted)
    r["baseline_ms"] = median_ms(lambda: base.full(x), it, wu)
    r["permute_in_ms"] = median_ms(lambda: base.permute_in(x), it, wu)
    r["raw_a2a_ms"] = median_ms(lambda: base.exchange(permuted), it, wu)
    r["permute_out_ms"] = median_ms(lambda: base.permute_out(received), it, wu)
    r["baseline_host_us"] = host_us(lambda: base.full(x), it)
    if ctx.gemms is not None:
        r["baseline_overlap"] = overlap(ctx.gemms, lambda: base.full(x), max(5, it // 4), 2)
    # Check, not time: the baseline and the fast path agree bit for bit.
    r["baseline_matches_fast"] = bool(torch.equal(base.full(x), copy()))
    return r
