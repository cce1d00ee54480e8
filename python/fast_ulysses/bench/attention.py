"""The bench's attention row (--pipeline G): one UlyssesAttention forward (no grad, the
inference path) with pipeline=G against pipeline=1 on the case's mode-0 shapes, plus the
largest difference between their outputs (a check, not a timing).

Pipelining pays where the transfer is hidden behind attention: on UlyssesGroup at P > 1 the
copy engines move group g + 1's q, k, v while group g attends. At P = 1 nothing moves, and
with ranks sharing one GPU they also share its SMs and copy engines: those rows say what the
pipeline costs (its extra calls and head-slice copies), not what it hides on a node.
"""

from __future__ import annotations

import torch

from .timing import agreed_error, median_ms

TAGS = ("bench.attn.q", "bench.attn.k", "bench.attn.v", "bench.attn.o")
MAX_ITERS, MAX_WARMUP = 10, 2  # one call is a whole attention: fewer than the collectives'


def attention_inputs(x: torch.Tensor, seed: int = 0) -> tuple:
    """q = x (the case's mode-0 input), k and v drawn like it (same shape, dtype, device)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    k, v = (torch.randn(x.shape, generator=g).to(x.device, x.dtype) for _ in range(2))
    return x, k, v


def run_attention(case, ctx, x: torch.Tensor) -> dict:
    """pipeline=1 and pipeline=ctx.pipeline on this rank: ms each (median of at most
    MAX_ITERS), the largest output difference, or the error every rank agreed on (a refused
    G or a failed call: every rank skips the timing)."""
    from ..attention import UlyssesAttention

    G = ctx.pipeline
    q, k, v = attention_inputs(x)
    kw = case.kwargs()
    plain = UlyssesAttention(ctx.fast, tags=TAGS)
    pipelined = UlyssesAttention(ctx.fast, tags=TAGS, pipeline=G)
    out = {
        "pipeline": G,
        "plain_ms": None,
        "pipelined_ms": None,
        "max_abs_diff": None,
        "error": None,
    }
    error = None
    with torch.no_grad():
        try:
            diff = (pipelined(q, k, v, **kw).float() - plain(q, k, v, **kw).float()).abs()
            out["max_abs_diff"] = diff.max().item() if diff.numel() else 0.0
        except Exception as e:  # noqa: BLE001 - recorded in the results, not fatal to the bench
            error = f"{type(e).__name__}: {e}"
        out["error"] = agreed_error(error)
        if out["error"] is not None:
            return out
        it, wu = min(ctx.iters, MAX_ITERS), min(ctx.warmup, MAX_WARMUP)
        out["plain_ms"] = median_ms(lambda: plain(q, k, v, **kw), it, wu)
        out["pipelined_ms"] = median_ms(lambda: pipelined(q, k, v, **kw), it, wu)
    return out
