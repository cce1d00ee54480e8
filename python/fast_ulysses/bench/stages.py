"""What one benchmark case times, stage by stage, on one rank.

Baseline (what yunchang / DeepSpeed-Ulysses do): permute + contiguous, `all_to_all_single` with
split sizes, permute + contiguous; and the raw `all_to_all_single` alone on the already permuted
buffer. fast-ulysses: the copy and borrowed entry points; the own-share relayout alone (torch
`copy_` of the same strided chunk on this GPU); GEMM-chain overlap; host CPU per call;
with --graph, CUDA-graph replays of one captured call of each entry point; with --pipeline G,
UlyssesAttention with pipeline=G against pipeline=1 (bench/attention.py); with --ring-degree R,
UlyssesAttention with ring steps against plain Ulysses (bench/usp.py); with --wire, the copy and
borrowed calls with FP8 on the wire and their error against the plain call (bench/wire.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .. import plan as make_plan
from ..plan import input_shape
from .timing import (
    agreed_error,
    capture,
    chain_length,
    host_us,
    median_ms,
    on_side,
    overlap,
    smaller_gemm,
)


@dataclass
class Case:
    name: str
    batch: int
    seq_splits: list
    head_splits: list
    head_dim: int
    dtype: torch.dtype

    def input_shape(self, rank: int, mode: int) -> tuple:  # bshd, from the plan
        return input_shape(
            len(self.seq_splits),
            rank,
            mode,
            batch=self.batch,
            head_dim=self.head_dim,
            seq_splits=self.seq_splits,
            head_splits=self.head_splits,
        )

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
        dist.all_to_all_single(
            out, flat.view(-1), self.out_splits, self.in_splits, group=self.group
        )
        return out

    def permute_out(self, received: torch.Tensor) -> torch.Tensor:
        c, r = self.case, self.rank
        b, d = c.batch, c.head_dim
        if self.mode == 0:  # blocks by source rank: (S rows as [i][b][s_i]) x h x d
            parts = torch.split(received, self.out_splits)
            views = [
                p.view(c.head_splits[r], b, c.seq_splits[i], d).permute(1, 2, 0, 3)
                for i, p in enumerate(parts)
            ]
            return torch.cat(views, dim=1)
        parts = torch.split(received, self.out_splits)  # (s_r, b, h_i, d) per source
        views = [
            p.view(c.seq_splits[r], b, c.head_splits[i], d).permute(1, 0, 2, 3)
            for i, p in enumerate(parts)
        ]
        return torch.cat(views, dim=2)

    def full(self, x: torch.Tensor) -> torch.Tensor:
        return self.permute_out(self.exchange(self.permute_in(x)))


def own_share_bytes(case: Case, mode: int, rank: int, x: torch.Tensor) -> int:
    """Bytes of x that stay on this rank: its own head chunk (mode 0) or sequence chunk (1)."""
    splits, dim = (case.head_splits, 2) if mode == 0 else (case.seq_splits, 1)
    return x.numel() // x.shape[dim] * splits[rank] * x.element_size()


def own_share_copy(case: Case, mode: int, rank: int, x: torch.Tensor):
    """The relayout of this rank's own share, as a torch copy_ of the same strided chunk."""
    p = make_plan(len(case.seq_splits), rank, mode, x.shape, x.dtype, **case.kwargs())
    out = torch.empty(p.output_shape, dtype=x.dtype, device=x.device)
    heads0 = sum(case.head_splits[:rank])
    rows0 = sum(case.seq_splits[:rank])
    if mode == 0:
        src = x[:, :, heads0 : heads0 + case.head_splits[rank]]
        dst = out[:, rows0 : rows0 + case.seq_splits[rank]]
    else:
        src = x[:, rows0 : rows0 + case.seq_splits[rank]]
        dst = out[:, :, heads0 : heads0 + case.head_splits[rank]]
    return lambda: dst.copy_(src)


def gemm_chain(device, size: int, count: int):
    a = torch.randn(size, size, dtype=torch.bfloat16, device=device)
    w = torch.randn(size, size, dtype=torch.bfloat16, device=device) / size**0.5

    def run():
        y = a
        for _ in range(count):
            y = y @ w
        return y

    return run


def fit_chain(device, max_size: int, target_ms: float, iters: int, warmup: int) -> tuple:
    """(GEMM size, count) for a chain of about target_ms: the size halved while one GEMM is much
    longer than the target, then as many GEMMs as fit (at least one)."""
    size = max_size
    while True:
        one = median_ms(gemm_chain(device, size, 1), iters, warmup)
        smaller = smaller_gemm(size, one, target_ms)
        if smaller is None:
            return size, chain_length(one, target_ms)
        size = smaller


def measure_overlap(ctx, collective) -> dict:
    """The collective beside a GEMM chain sized to the collective's own time (--gemms auto) or
    --gemms GEMMs of --gemm-size, measured --overlap-repeats times (timing.overlap)."""
    it, wu = max(5, ctx.iters // 4), 2
    target = median_ms(on_side(collective), it, wu)
    size, count = ctx.gemm_size, ctx.gemms
    if count == "auto":
        size, count = fit_chain(ctx.device, ctx.gemm_size, target, it, wu)
    o = overlap(gemm_chain(ctx.device, size, count), collective, it, wu, ctx.overlap_repeats)
    o.update(gemm_size=size, gemms=count, target_ms=target)
    return o


def graph_timing(fn, iters: int, warmup: int) -> dict:
    """ms and host us per replay of a CUDA graph of one fn() (timing.capture), or why not:
    when capture raised on any rank, every rank skips the replays (a lone replay would wait
    for peers forever) and records that rank's error."""
    error, graph = None, None
    try:
        graph = capture(fn)
    except Exception as e:  # noqa: BLE001 - recorded in the results, not fatal to the bench
        error = f"{type(e).__name__}: {e}"
    error = agreed_error(error)
    if error is not None:
        return {"ms": None, "host_us": None, "error": error}
    out = {
        "ms": median_ms(graph.replay, iters, warmup),
        "host_us": host_us(graph.replay, iters),
        "error": None,
    }
    graph.reset()
    return out


def _wait(t):
    return t.wait() if hasattr(t, "wait") else t


def _entry_points(fast, x, mode: int, tag: str, kw: dict) -> tuple:
    """(copy, borrowed): the two fast entry points on x, each with its own tag."""
    copy = lambda: _wait(fast.all_to_all_single_4d(x, mode, tag, **kw))  # noqa: E731
    borrowed = lambda: fast.all_to_all_single_4d_borrowed(x, mode, tag + "-b", **kw)  # noqa: E731
    return copy, borrowed


def run_case(case: Case, mode: int, ctx) -> dict:
    """Times every stage of one (case, mode) on this rank; numbers in ms, host in us.
    `ctx` has: rank, device, fast (UlyssesGroup), baseline_group (None when it cannot run),
    iters, warmup, gemm_size, gemms ("auto", a count, or 0: no overlap), overlap_repeats,
    graph (time CUDA-graph replays too), optionally fused, pipeline (0: no attention row),
    ring_degree (0: no USP row) and wire (a format's name, or None: no wire row)."""
    x = (torch.randn(case.input_shape(ctx.rank, mode), device=ctx.device) * 2).to(case.dtype)
    copy, borrowed = _entry_points(ctx.fast, x, mode, f"{case.name}-{mode}", case.kwargs())
    r = {"bytes_in": x.numel() * x.element_size()}
    r["peer_bytes"] = r["bytes_in"] - own_share_bytes(case, mode, ctx.rank, x)
    it, wu = ctx.iters, ctx.warmup
    r["fast_copy_ms"] = median_ms(copy, it, wu)
    r["fast_borrowed_ms"] = median_ms(borrowed, it, wu)
    r["own_share_ms"] = median_ms(own_share_copy(case, mode, ctx.rank, x), it, wu)
    r["fast_copy_host_us"] = host_us(copy, it)
    r["fast_borrowed_host_us"] = host_us(borrowed, it)
    if ctx.gemms:
        r["fast_overlap"] = measure_overlap(ctx, copy)
    if ctx.baseline_group is not None:
        r.update(run_baseline(case, mode, ctx, x, copy))
    if getattr(ctx, "fused", False) and mode == 0:
        r["fused"] = run_fused(case, ctx, x)
    if getattr(ctx, "pipeline", 0) and mode == 0:
        from .attention import run_attention

        r["attention"] = run_attention(case, ctx, x)
    if getattr(ctx, "ring_degree", 0) and mode == 0:
        from .usp import run_usp

        r["usp"] = run_usp(case, ctx, x)
    if getattr(ctx, "wire", None):  # the same calls with FP8 on the wire, and their error
        from .wire import run_wire

        r["wire"] = run_wire(case, mode, ctx, x, copy)
    if ctx.graph:  # own tags: one eager call sizes their windows, then capture and replay
        g_copy, g_borrowed = _entry_points(
            ctx.fast, x, mode, f"{case.name}-{mode}-g", case.kwargs()
        )
        r["graph_copy"] = graph_timing(g_copy, it, wu)
        r["graph_borrowed"] = graph_timing(g_borrowed, it, wu)
    return r


def run_baseline(case: Case, mode: int, ctx, x, copy) -> dict:
    """The baseline's stages, eager (gloo cannot be captured), and the bit-exact check."""
    base = Baseline(ctx.baseline_group, case, mode, ctx.rank)
    permuted = base.permute_in(x)
    received = base.exchange(permuted)
    it, wu = ctx.iters, ctx.warmup
    r = {
        "baseline_ms": median_ms(lambda: base.full(x), it, wu),
        "permute_in_ms": median_ms(lambda: base.permute_in(x), it, wu),
        "raw_a2a_ms": median_ms(lambda: base.exchange(permuted), it, wu),
        "permute_out_ms": median_ms(lambda: base.permute_out(received), it, wu),
        "baseline_host_us": host_us(lambda: base.full(x), it),
    }
    if ctx.gemms:
        r["baseline_overlap"] = measure_overlap(ctx, lambda: base.full(x))
    # Check, not time: the baseline and the fast path agree bit for bit.
    r["baseline_matches_fast"] = bool(torch.equal(base.full(x), copy()))
    return r


def fused_style(case: Case) -> tuple[str, str]:
    """(norm, rope_style) a model of `case` uses: HunyuanVideo per-head + rotate-half, Wan (and
    anything else) all-heads + interleaved."""
    return ("per_head", "half") if "hunyuan" in case.name else ("all_heads", "interleaved")


def run_fused(case: Case, ctx, x: torch.Tensor) -> dict:
    """Mode 0 of q with RMSNorm + RoPE: the fused scatter against the unfused torch sequence
    (norm_rope_reference, then the borrowed all-to-all) and the plain borrowed all-to-all, each
    on its own tag. `bytes_moved` is what the fused kernel reads and writes (x in, x out)."""
    from ..fused import norm_rope_reference, qk_norm_rope_all_to_all

    norm, style = fused_style(case)
    b, s, n, d = x.shape  # bshd
    g = torch.Generator(device="cpu").manual_seed(0)
    weight = (torch.rand(n * d if norm == "all_heads" else d, generator=g) + 0.5).to(ctx.device)
    angle = (torch.rand(s, d // 2, generator=g) * 6.28).to(ctx.device)
    kw = dict(
        norm_weight=weight, eps=1e-6, cos=angle.cos(), sin=angle.sin(), norm=norm, rope_style=style
    )
    split = case.kwargs()
    tag = f"{case.name}-fused"

    def fused():
        return qk_norm_rope_all_to_all(ctx.fast, x, tag, borrowed=True, **kw, **split)

    unfused = lambda: ctx.fast.all_to_all_single_4d_borrowed(  # noqa: E731
        norm_rope_reference(
            x,
            rope_style=style,
            norm=norm,
            **{k: kw[k] for k in ("norm_weight", "eps", "cos", "sin")},
        ),
        0,
        tag + "-u",
        **split,
    )
    plain = lambda: ctx.fast.all_to_all_single_4d_borrowed(x, 0, tag + "-p", **split)  # noqa: E731
    it, wu = ctx.iters, ctx.warmup
    return {
        "norm": norm,
        "rope_style": style,
        "fused_ms": median_ms(fused, it, wu),
        "unfused_ms": median_ms(unfused, it, wu),
        "plain_borrowed_ms": median_ms(plain, it, wu),
        "fused_host_us": host_us(fused, it),
        "bytes_moved": 2 * x.numel() * x.element_size(),
    }
