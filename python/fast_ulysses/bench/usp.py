"""The bench's USP row (--ring-degree R): attention with ring steps against plain Ulysses, on the
same ranks and the case's mode-0 shapes. One forward each (no grad, the inference path), ms
each, their ratio and the largest difference between their outputs (a check, not a timing).

At P ranks and R > 1: UlyssesAttention over all P ranks (plain) against UlyssesAttention over
`make_group((ulysses, ring))` with the standard layout of `fast_ulysses.usp_mesh(P / R)`: Ulysses
groups of P / R consecutive ranks, rings of R ranks, one from each. Every rank keeps its
sequence rows, so both compute the same attention of the same rows over the whole sequence.
At R = 1 (`auto` at P = 1) there is no ring to step around: the row times the ring machinery's
own cost, `ring_attention(q, k, v, None)` (its block kernel and log-sum-exp merge) against
SDPA on the same heads (this rank's q, k and v, all heads, its own rows).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..cli._args import integer
from ..presets import even_splits
from .attention import TAGS, attention_inputs
from .timing import agreed_error, median_ms

MAX_ITERS, MAX_WARMUP = 10, 2  # one call is a whole attention, as in the pipeline row


def ring_degree_option(text: str):
    """--ring-degree: "auto" (2 where P is even, 1 at P = 1) or a degree R >= 0 (0: no row)."""
    if text == "auto":
        return text
    return integer("2 or auto", minimum=0)(text)


def ring_degree(option, world_size: int) -> tuple[int | None, str]:
    """--ring-degree at P = `world_size`: (R, "") or (None, why the row is skipped).
    `auto`: 1 at P = 1, 2 where P is even, skipped where P is odd and above 1."""
    if option == "auto":
        if world_size == 1:
            return 1, ""
        if world_size % 2:
            return None, (
                f"--ring-degree auto: P = {world_size} is odd (auto takes 2); give "
                "--ring-degree R for an R dividing P"
            )
        return 2, ""
    if world_size % option:
        return None, f"--ring-degree {option} does not divide P = {world_size}"
    return option, ""


def usp_layout(world_size: int, ring: int) -> tuple[list, list]:
    """(Ulysses groups, rings) of `usp_mesh(world_size // ring)`: world rank = ring index x U +
    Ulysses index, U = world_size // ring."""
    u = world_size // ring
    groups = [list(range(i * u, (i + 1) * u)) for i in range(ring)]
    rings = [list(range(j, world_size, u)) for j in range(u)]
    return groups, rings


def usp_kwargs(case, ring: int, rank: int) -> dict:
    """The splits of this rank's Ulysses group: the rows each member holds (the case's, theirs)
    and the case's heads split evenly over the U = P / R members."""
    u = len(case.seq_splits) // ring
    first = rank // u * u
    return dict(
        seq_splits=list(case.seq_splits[first : first + u]),
        head_splits=even_splits(sum(case.head_splits), u),
    )


def usp_group(ctx, ring: int):
    """This rank's Ulysses group of the (ring x Ulysses) layout, its `ring_group` set, built
    once per R and kept in `ctx.usp_groups` (every rank makes every subgroup, in one order).
    It is the kind of `ctx.fast`: the fast group (prefer="fast") or the torch fallback."""
    import fast_ulysses as fu

    cache = ctx.__dict__.setdefault("usp_groups", {})
    if ring not in cache:
        rank, P = dist.get_rank(), dist.get_world_size()
        groups, rings = usp_layout(P, ring)
        made = [dist.new_group(ranks) for ranks in groups + rings]  # every rank, every group
        u = P // ring
        pair = (made[rank // u], made[ring + rank % u])
        prefer = "torch" if isinstance(ctx.fast, fu.TorchUlyssesGroup) else "fast"
        cache[ring] = fu.make_group(pair, prefer=prefer)
    return cache[ring]


def close(ctx) -> None:
    """Destroys the USP groups `usp_group` built (the bench's end)."""
    for group in getattr(ctx, "usp_groups", {}).values():
        group.destroy()


def _calls(case, ctx, x, ring: int) -> tuple:
    """(plain, with ring, what each is): two no-argument calls on this rank's q, k and v."""
    from ..attention import UlyssesAttention
    from ..ring import ring_attention

    q, k, v = attention_inputs(x)
    P = dist.get_world_size()
    if ring == 1:
        # bshd -> bhsd, every head here; contiguous before the timing, so neither call copies
        qb, kb, vb = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        return (
            lambda: F.scaled_dot_product_attention(qb, kb, vb),
            lambda: ring_attention(qb, kb, vb, None),
            "SDPA on this rank's heads",
            "ring_attention, no ring (block kernel + merge)",
        )
    kw, ukw = case.kwargs(), usp_kwargs(case, ring, dist.get_rank())
    plain = UlyssesAttention(ctx.fast, tags=TAGS)  # the pipeline row's (free after each call)
    usp = UlyssesAttention(usp_group(ctx, ring), tags=TAGS)  # its ring: the group's
    return (
        lambda: plain(q, k, v, **kw),
        lambda: usp(q, k, v, **ukw),
        f"UlyssesAttention, Ulysses {P}",
        f"UlyssesAttention, ring {ring} x Ulysses {P // ring}",
    )


def run_usp(case, ctx, x: torch.Tensor) -> dict:
    """Plain and with ring steps on this rank (`ring_degree(ctx.ring_degree, P)`): ms each
    (median of at most MAX_ITERS), the largest output difference, the reason the row is skipped,
    or the error every rank agreed on (a failed call: every rank skips the timing)."""
    ring, skipped = ring_degree(ctx.ring_degree, dist.get_world_size())
    out = {
        "ring_degree": ring,
        "plain": None,
        "ring": None,
        "plain_ms": None,
        "ring_ms": None,
        "max_abs_diff": None,
        "skipped": skipped or None,
        "error": None,
    }
    if ring is None:
        return out
    error = None
    with torch.no_grad():
        try:
            plain, usp, out["plain"], out["ring"] = _calls(case, ctx, x, ring)
            diff = (usp().float() - plain().float()).abs()
            out["max_abs_diff"] = diff.max().item() if diff.numel() else 0.0
        except Exception as e:  # noqa: BLE001 - recorded in the results, not fatal to the bench
            error = f"{type(e).__name__}: {e}"
        out["error"] = agreed_error(error)
        if out["error"] is not None:
            return out
        it, wu = min(ctx.iters, MAX_ITERS), min(ctx.warmup, MAX_WARMUP)
        out["plain_ms"] = median_ms(plain, it, wu)
        out["ring_ms"] = median_ms(usp, it, wu)
    return out
