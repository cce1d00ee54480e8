"""One rank of tests/python/test_deepspeed_adapter.py (gloo CPU ranks; P = 1, 2, 3 as the last
P ranks of the world; with --shared-gpu, tests/gpu/test_upstream_gpu.py: every rank on cuda:0,
ours on the fast group, DeepSpeed on the same CUDA tensors over the gloo process group, one
launch per P): fast_ulysses.integrations.deepspeed.DistributedAttention against the installed
deepspeed.sequence.layer.DistributedAttention (0.19.8) with the same local attention, bit for
bit, output and every input's gradient:
- fast_group_P<p> (--shared-gpu only): the registry's group is the fast one;
- deepspeed_pairs_P<p>: every (scatter_idx, gather_idx) of -1..3 x -1..3, batch_dim_idx 0 and
  1, shapes chosen so DeepSpeed's even-heads path accepts them. For a pair on the same side of
  2 at P > 1 the forward is compared, and the backward must fail in both (ours with
  FastUlyssesError);
- deepspeed_rotary_P<p>: rotary_pos_emb with (2, 0) and (1, 2), both layouts;
- deepspeed_errors_P<p> (P > 1): fewer key heads than P, q heads or a scattered sequence not
  divisible by P (DeepSpeed errors on these three) raise FastUlyssesError;
- deepspeed_uneven_P<p> (P > 1): DeepSpeed's uneven-heads path (key-value heads P + 1 and
  2P + 1): equal heads, GQA (q with twice the key heads) and num_kv_heads given where the key's
  own head count would be even, with (2, s) and (s, 2) (s the layout's sequence dimension), both
  layouts, and once with rotary_pos_emb; q, k and v gradients too;
- deepspeed_uneven_errors_P<p> (P > 1): another index pair (DeepSpeed fails too), heads that
  are not a multiple of the key-value heads, and (P = 2) the shapes where DeepSpeed's float
  arithmetic sizes a receive buffer one short: refused in forward, or (forward bit-equal to
  DeepSpeed's) in backward. DeepSpeed is not run on the last two: one of its ranks raises and
  the others wait in the collective.
DeepSpeed's uneven path reads each rank's share from deepspeed.utils.groups' sequence-parallel
rank (its mpu); the checks set an mpu whose rank is the rank in the group under test.
Every rank's input is different, so a chunk sent to the wrong rank shows.
"""

from __future__ import annotations

import argparse
import os
import sys

import deepspeed_uneven as uneven
import integrations as adapters
import torch
import torch.distributed as dist
from multirank import check_fast_group, run_on_subgroups, subgroup_sizes

from fast_ulysses.attention import group_for
from fast_ulysses.errors import FastUlyssesError
from fast_ulysses.integrations import deepspeed as ours

INDICES = (-1, 0, 1, 2, 3)
CHECKS = (
    "deepspeed_pairs",
    "deepspeed_rotary",
    "deepspeed_errors",
    "deepspeed_uneven",
    "deepspeed_uneven_errors",
)
MULTI_RANK = ("deepspeed_errors", "deepspeed_uneven", "deepspeed_uneven_errors")  # P > 1 only


def side(idx) -> int:
    """DeepSpeed's direction: 1 scatters the sequence (idx < 2), 0 scatters heads."""
    return 1 if idx < 2 else 0


def bshd_shape(scatter_idx, gather_idx, P):
    """A (b, s, h, d) input DeepSpeed's even path accepts for the pair at P (key heads too)."""
    m_in, m_out = side(scatter_idx), side(gather_idx)
    if (m_in, m_out) == (0, 1):
        return (2, 3, 2 * P, 8)
    if (m_in, m_out) == (1, 0):
        return (2, 3 * P, P, 8)
    if m_in == 0:  # heads scattered twice
        return (2, 3, P * P, 8)
    return (2, 3 * P * P, P, 8)  # sequence scattered twice


def shape_for(batch_dim_idx, bshd):
    b, s, h, d = bshd
    return bshd if batch_dim_idx == 0 else (s, b, h, d)


def modules(scatter_idx, gather_idx, pg):
    from deepspeed.sequence.layer import DistributedAttention as Upstream

    return (
        ours.DistributedAttention(adapters.local_attention, pg, scatter_idx, gather_idx),
        Upstream(adapters.local_attention, pg, scatter_idx, gather_idx),
    )


def call(module, batch_dim_idx, rotary=None):
    layout = "bshd" if batch_dim_idx == 0 else "sbhd"
    return lambda x: module(x, x * 2, x + 1, batch_dim_idx, rotary, layout)


def compare_no_backward(label, f_ours, f_upstream, shape, seed, device):
    """Forward bit for bit; then both backwards must fail, ours with FastUlyssesError."""
    g = torch.Generator().manual_seed(seed * 100 + dist.get_rank())
    x = torch.randn(shape, generator=g).to(device)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    a, b = f_ours(xa), f_upstream(xb)
    assert adapters.same_bits(a.detach(), b.detach()), f"{label}: forward differs from DeepSpeed"
    w = torch.randn(a.shape, generator=g).to(device)
    try:
        (b * w).sum().backward()
    except Exception:  # noqa: BLE001 - DeepSpeed's: an AssertionError or autograd's RuntimeError
        pass
    else:
        raise AssertionError(f"{label}: DeepSpeed's backward did not fail")
    try:
        (a * w).sum().backward()
    except FastUlyssesError as error:
        assert "no backward" in str(error), f"{label}: {error}"
    else:
        raise AssertionError(f"{label}: our backward did not raise FastUlyssesError")


def check_pairs(pg, P, device):
    n = 0
    for scatter_idx in INDICES:
        for gather_idx in INDICES:
            for batch_dim_idx in (0, 1):
                n += 1
                label = (
                    f"DistributedAttention(scatter_idx={scatter_idx}, "
                    f"gather_idx={gather_idx}) batch_dim_idx={batch_dim_idx}"
                )
                shape = shape_for(batch_dim_idx, bshd_shape(scatter_idx, gather_idx, P))
                mine, theirs = modules(scatter_idx, gather_idx, pg)
                f_ours, f_up = call(mine, batch_dim_idx), call(theirs, batch_dim_idx)
                if side(scatter_idx) == side(gather_idx) and P > 1:
                    compare_no_backward(label, f_ours, f_up, shape, 100 + n, device)
                else:
                    adapters.compare(label, f_ours, f_up, shape, device, 100 + n, ref_device=device)


def check_rotary(pg, P, device):
    g = torch.Generator().manual_seed(41)
    n = 0
    for scatter_idx, gather_idx in ((2, 0), (1, 2)):
        bshd = bshd_shape(scatter_idx, gather_idx, P)
        # the sequence length q has after its all-to-all
        s_after = bshd[1] * P if side(scatter_idx) == 0 else bshd[1] // P
        for batch_dim_idx in (0, 1):
            n += 1
            table = (
                torch.rand(s_after, 1, 1, 4, generator=g)
                if batch_dim_idx == 0
                else torch.rand(2, s_after, 1, 4, generator=g)
            ) * 6.28
            rotary = (table.cos().to(device), table.sin().to(device))
            mine, theirs = modules(scatter_idx, gather_idx, pg)
            adapters.compare(
                f"DistributedAttention(scatter_idx={scatter_idx}, gather_idx="
                f"{gather_idx}) batch_dim_idx={batch_dim_idx} with rotary_pos_emb",
                call(mine, batch_dim_idx, rotary),
                call(theirs, batch_dim_idx, rotary),
                shape_for(batch_dim_idx, bshd),
                device,
                200 + n,
                ref_device=device,
            )


def check_errors(pg, P, device):
    # Shapes DeepSpeed's even path refuses (an assert, a reshape error): q's heads not divisible
    # by P where heads are scattered, the sequence not divisible where it is scattered.
    for pair, q, kv in (
        ((2, 0), (2, 3, P + 1, 8), (2, 3, P, 8)),
        ((1, 2), (2, 3 * P + 1, P, 8), (2, 3 * P + 1, P, 8)),
    ):
        mine, theirs = modules(*pair, pg)
        for module, error_type in (
            (theirs, (AssertionError, RuntimeError)),
            (mine, FastUlyssesError),
        ):
            qt, kvt = torch.randn(q, device=device), torch.randn(kv, device=device)
            try:
                module(qt, kvt, kvt, 0, None, "bshd")
            except error_type:
                pass
            else:
                raise AssertionError(f"{pair} q {q}, k {kv}: {module} accepted it")
    # (1, 2) with 1 local key head < P: DeepSpeed asserts; ours raises before sending.
    y = torch.randn(2, 3 * P, 1, 8, device=device)
    mine, theirs = modules(1, 2, pg)
    try:
        theirs(y, y, y, 0, None, "bshd")
    except AssertionError:
        pass
    else:
        raise AssertionError("DeepSpeed accepted fewer key heads than P")
    try:
        mine(y, y, y, 0, None, "bshd")
    except FastUlyssesError as error:
        assert f"key.shape[2]=1: DeepSpeed needs at least the sequence parallel size P={P}" in str(
            error
        ), str(error)
    else:
        raise AssertionError("fewer key heads than P did not raise")


FUNCTIONS = {
    "deepspeed_pairs": check_pairs,
    "deepspeed_rotary": check_rotary,
    "deepspeed_errors": check_errors,
    "deepspeed_uneven": uneven.check_uneven,
    "deepspeed_uneven_errors": uneven.check_uneven_errors,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--shared-gpu",
        action="store_true",
        help="every rank on cuda:0, ours on the fast group (FAST_ULYSSES_ALLOW_SHARED_GPU=1)",
    )
    args = parser.parse_args()
    # DeepSpeed's accelerator: the CPU one on CPU ranks (what it detects there too), CUDA's on
    # ranks sharing the GPU; its all-to-alls go through torch.distributed either way.
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if args.shared_gpu else "cpu")

    def body(report, pg, P, device):
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        if args.shared_gpu:
            check_fast_group(report, pg, P)
        for name in CHECKS:
            if name in MULTI_RANK and P == 1:
                continue
            with report.check(f"{name}_P{P}"):
                FUNCTIONS[name](pg, P, device)
        group_for(pg).destroy()  # the registry's group for pg (collective)

    return run_on_subgroups(args.shared_gpu, body)


def check_names(world: int, shared_gpu: bool = False) -> list[str]:
    """Every check at every P; with shared_gpu at P = world only (one launch per P), after the
    launch's multirank.FAST_GROUP_CHECK."""
    return [
        f"{name}_P{P}"
        for P in subgroup_sizes(world, shared_gpu)
        for name in CHECKS
        if not (name in MULTI_RANK and P == 1)
    ]


if __name__ == "__main__":
    sys.exit(main())
