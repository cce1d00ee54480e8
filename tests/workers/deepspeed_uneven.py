"""The uneven-heads checks of deepspeed_adapter.py (see its docstring): DeepSpeed 0.19.8's
`uneven_heads_all2all` path (key-value heads not divisible by P) against
fast_ulysses.integrations.deepspeed.DistributedAttention, on one gloo group of P > 1 ranks, the
tensors on the worker's device (the CPU, or cuda:0 with --shared-gpu)."""

from __future__ import annotations

import contextlib
import types

import integrations as adapters
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from fast_ulysses.errors import FastUlyssesError
from fast_ulysses.integrations import deepspeed as ours


def gqa_attention(q, k, v, layout):
    """SDPA (math backend, deterministic) on (b, s, h, d) or (s, b, h, d), q with a multiple of
    k's and v's heads (enable_gqa: q head i uses key head i // (hq / hk))."""
    order = (0, 2, 1, 3) if layout == "bshd" else (1, 2, 0, 3)
    with sdpa_kernel(SDPBackend.MATH):
        o = F.scaled_dot_product_attention(
            *(t.permute(order).contiguous() for t in (q, k, v)), enable_gqa=True
        )
    return o.permute([order.index(i) for i in range(4)])


@contextlib.contextmanager
def deepspeed_rank(pg):
    """DeepSpeed's uneven path reads each rank's share from deepspeed.utils.groups' sequence-
    parallel rank (its mpu): one whose rank is the rank in `pg`, for the span."""
    from deepspeed.utils import groups

    saved = groups.mpu
    groups.mpu = types.SimpleNamespace(get_sequence_parallel_rank=lambda: dist.get_rank(pg))
    try:
        yield
    finally:
        groups.mpu = saved


def modules(pg, pair, num_kv_heads):
    from deepspeed.sequence.layer import DistributedAttention as Upstream

    return (
        ours.DistributedAttention(gqa_attention, pg, *pair, num_kv_heads=num_kv_heads),
        Upstream(gqa_attention, pg, *pair, num_kv_heads=num_kv_heads),
    )


def shares(kv, P):
    """DeepSpeed's key-value heads a rank, written from its documented rule (the larger shares
    first); the test's inputs follow it, the adapter must too."""
    return [kv // P + (1 if r < kv % P else 0) for r in range(P)]


def inputs(shapes, seed, device):
    g = torch.Generator().manual_seed(seed * 100 + dist.get_rank())
    return [torch.randn(shape, generator=g).to(device) for shape in shapes]


def run(module, qkv, w, batch_dim_idx, layout, rotary, backward=True):
    leaves = [t.clone().requires_grad_() for t in qkv]
    out = module(*leaves, batch_dim_idx, rotary, layout)
    if backward:
        (out * w).sum().backward()
    return [out.detach()] + ([t.grad for t in leaves] if backward else [])


def compare(label, pg, pair, num_kv_heads, shapes, batch_dim_idx, seed, device, rotary=None):
    """q, k, v of `shapes` (different on every rank) on `device`: output and the three gradients
    bit for bit against DeepSpeed's."""
    layout = "bshd" if batch_dim_idx == 0 else "sbhd"
    mine, theirs = modules(pg, pair, num_kv_heads)
    qkv = inputs(shapes, seed, device)
    # Both pairs (one index 2, the other the sequence) give an output shaped like q.
    w = torch.randn(shapes[0], generator=torch.Generator().manual_seed(seed)).to(device)
    with deepspeed_rank(pg):
        want = run(theirs, qkv, w, batch_dim_idx, layout, rotary)
    got = run(mine, qkv, w, batch_dim_idx, layout, rotary)
    for name, a, b in zip(("output", "q.grad", "k.grad", "v.grad"), got, want):
        assert adapters.same_bits(a, b), (
            f"{label}: {name} differs from DeepSpeed's (rank {dist.get_rank(pg)} of P="
            f"{dist.get_world_size(pg)}; shapes {a.shape} and {b.shape})"
        )


def qkv_shapes(pair, seq_dim, batch_dim_idx, P, rank, hq, hk, kv):
    """(q, k, v) shapes: heads scattered first -> (b, 3, h, d) shards of every head; sequence
    scattered first -> the whole sequence 3P with this rank's share of the heads."""
    b, s, d = 2, 3, 8
    if pair[0] == 2:
        dims = [(b, s, h, d) for h in (hq, hk, hk)]
    else:
        share = shares(kv, P)[rank]
        dims = [(b, s * P, h // kv * share, d) for h in (hq, hk, hk)]
    return [t if batch_dim_idx == 0 else (t[1], t[0], t[2], t[3]) for t in dims]


def check_uneven(pg, P, device):
    rank = dist.get_rank(pg)
    n = 0
    for kv in (P + 1, 2 * P + 1):
        # (label, num_kv_heads argument, q heads, k and v heads)
        cases = [
            ("equal heads", None, kv, kv),
            ("GQA, q with twice the key heads", None, 2 * kv, kv),
            (f"num_kv_heads={kv}, q, k and v with {2 * kv} heads", kv, 2 * kv, 2 * kv),
        ]
        for label, num_kv_heads, hq, hk in cases:
            for batch_dim_idx in (0, 1):
                seq_dim = 1 if batch_dim_idx == 0 else 0
                for pair in ((2, seq_dim), (seq_dim, 2)):
                    n += 1
                    shapes = qkv_shapes(pair, seq_dim, batch_dim_idx, P, rank, hq, hk, kv)
                    # Sequence scattered first: the key holds this rank's heads, so DeepSpeed
                    # needs the count given (key.shape[2] would be the rank's share).
                    given = kv if pair[0] != 2 and num_kv_heads is None else num_kv_heads
                    compare(
                        f"{label}, {kv} key-value heads, DistributedAttention{pair} "
                        f"batch_dim_idx={batch_dim_idx} num_kv_heads={given}",
                        pg,
                        pair,
                        given,
                        shapes,
                        batch_dim_idx,
                        500 + n,
                        device,
                    )
    # rotary_pos_emb on the uneven path: (S, 1, 1, r) tables, the whole sequence after (2, 1).
    angles = (torch.rand(3 * P, 1, 1, 4, generator=torch.Generator().manual_seed(7)) * 6.28).to(
        device
    )
    compare(
        "rotary_pos_emb, equal heads, DistributedAttention(2, 1)",
        pg,
        (2, 1),
        None,
        qkv_shapes((2, 1), 1, 0, P, rank, P + 1, P + 1, P + 1),
        0,
        600,
        device,
        (angles.cos(), angles.sin()),
    )


def expect_refusal(label, call, words):
    try:
        call()
    except FastUlyssesError as error:
        assert words in str(error), f"{label}: {error}"
    else:
        raise AssertionError(f"{label}: not refused")


def check_uneven_errors(pg, P, device):
    kv = P + 1
    x = torch.randn(2, 3, kv, 8, device=device)
    # (2, 0) with (b, s, h, d): DeepSpeed's uneven path reshapes by dimension 0 (the batch) as if
    # it were the sequence, and fails; ours refuses before sending.
    mine, theirs = modules(pg, (2, 0), None)
    with deepspeed_rank(pg):
        try:
            theirs(x, x, x, 0, None, "bshd")
        except (AssertionError, RuntimeError):
            pass
        else:
            raise AssertionError("DeepSpeed's uneven path accepted (2, 0) with batch_dim_idx=0")
    expect_refusal(
        "(2, 0) with batch_dim_idx=0",
        lambda: mine(x, x, x, 0, None, "bshd"),
        "runs with (2, 1) or (1, 2) only",
    )
    # q heads not a multiple of the key-value heads (DeepSpeed's shares would not line up).
    mine, _ = modules(pg, (2, 1), None)
    q = torch.randn(2, 3, kv + 1, 8, device=device)
    expect_refusal(
        "q heads kv + 1", lambda: mine(q, x, x, 0, None, "bshd"), f"query has {kv + 1} heads"
    )
    if P != 2:
        return
    # DeepSpeed's float sizing: 13 key-value heads on 2 ranks (shares 7 and 6), one row a rank.
    # Head dim 9, equal heads: its forward's output gather comes out one short -> refused there.
    x = torch.randn(2, 1, 13, 9, device=device)
    mine, _ = modules(pg, (2, 1), None)
    expect_refusal(
        "13 heads of 9 on 2 ranks",
        lambda: mine(x, x, x, 0, None, "bshd"),
        "sizes its receive buffer and head count as int(13 / 6 * n)",
    )
    # q with 39 heads (3 per key head), head dim 9: the output gathers 39 heads (fine), but the
    # backward gathers k's and v's 13 (one short): forward equal to DeepSpeed's, backward refused.
    qkv = inputs([(2, 1, 39, 9), (2, 1, 13, 9), (2, 1, 13, 9)], 700, device)
    mine, theirs = modules(pg, (2, 1), None)
    with deepspeed_rank(pg):
        want = run(theirs, qkv, None, 0, "bshd", None, backward=False)[0]
    out = mine(*(t.clone().requires_grad_() for t in qkv), 0, None, "bshd")
    assert adapters.same_bits(out.detach(), want), "39 q heads of 9: forward differs"
    expect_refusal(
        "39 q heads, 13 key heads of 9: backward",
        lambda: out.sum().backward(),
        "no backward: DeepSpeed's uneven-heads gather fails here",
    )
