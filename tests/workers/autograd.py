"""One rank of the autograd test (run by tests/python/test_autograd.py on gloo CPU ranks, and by
tests/gpu/test_autograd_gpu.py with --shared-gpu for the fast group on one GPU).

All ranks join one world; for P = 1..world_size the last P ranks form a subgroup. Per P, checks:
- grads_P<p>: x.grad after a distributed backward equals single-process autograd through a
  differentiable reference (torch.cat + narrow; its forward is checked against
  fast_ulysses.simulate), bit for bit, for both modes, every layout the plan accepts, even and
  uneven splits (zero-row and zero-head ranks), float32 and bfloat16;
- residual_P<p>: x + 2 * a2a1(a2a0(x)) has gradient 3 everywhere (the issue's residual block);
- borrowed_P<p>: a borrowed call refuses an input that requires grad, and works under no_grad;
- auto_tag_P<p>: tag=None picks the same tag on every rank with uneven splits, and works.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.distributed as dist
from multirank import run_on_subgroups, subgroup_sizes

import fast_ulysses as fu

CANDIDATE_LAYOUTS = ("bshd", "sbhd", "bhsd")
D = 8


def layouts(P: int) -> list[str]:
    """The layouts the plan accepts (bhsd once it lands)."""
    found = []
    for layout in CANDIDATE_LAYOUTS:
        try:
            fu.plan(
                P,
                0,
                0,
                shape_of(layout, 1, 1, P),
                torch.float32,
                seq_splits=[1] * P,
                head_splits=[1] * P,
                layout=layout,
            )
        except ValueError:
            continue
        found.append(layout)
    return found


def split_cases(P: int):
    uneven_seq = [(3 * r + 2) % 4 for r in range(P)] if P > 1 else [3]  # 2, 1, 0
    uneven_heads = [2, 1, 0][:P] if P > 1 else [3]
    return [("even", None, None), ("uneven", uneven_seq, uneven_heads)]


def shape_of(layout, b, s, h):
    sizes = {"b": b, "s": s, "h": h, "d": D}
    return tuple(sizes[c] for c in layout)


def input_shapes(mode, layout, P, seq, heads, b=2):
    seq = seq or [2] * P
    heads = heads or [2] * P
    if mode == 0:
        return [shape_of(layout, b, seq[r], sum(heads)) for r in range(P)], seq, heads
    return [shape_of(layout, b, sum(seq), heads[r]) for r in range(P)], seq, heads


def reference(xs, mode, seq, heads, layout):
    """Every rank's output, differentiable, in one process."""
    s_dim, h_dim = layout.index("s"), layout.index("h")
    cat, cut, splits = (s_dim, h_dim, heads) if mode == 0 else (h_dim, s_dim, seq)
    full = torch.cat(xs, dim=cat)
    starts = [sum(splits[:r]) for r in range(len(splits))]
    return [full.narrow(cut, start, n) for start, n in zip(starts, splits)]


def same_bits(a, b) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8),
            b.contiguous().reshape(-1).view(torch.uint8),
        )
    )


def check_grads(group, P, device) -> int:
    rank, count = group.rank, 0
    for (name, seq, heads), mode, layout, dtype in itertools.product(
        split_cases(P), (0, 1), layouts(P), (torch.float32, torch.bfloat16)
    ):
        shapes, seq_r, heads_r = input_shapes(mode, layout, P, seq, heads)
        g = torch.Generator().manual_seed(1000 * P + count)
        xs = [torch.randn(s, generator=g).to(dtype).requires_grad_() for s in shapes]
        outs = reference(xs, mode, seq_r, heads_r, layout)
        weights = [torch.randn(o.shape, generator=g) for o in outs]
        if layout in ("bshd", "sbhd"):
            sim = fu.simulate(
                [x.detach() for x in xs], mode, seq_splits=seq, head_splits=heads, layout=layout
            )
            assert all(same_bits(a.detach(), b) for a, b in zip(outs, sim)), (
                f"{name} mode {mode} {layout}: the reference differs from simulate"
            )
        sum((o.float() * w).sum() for o, w in zip(outs, weights)).backward()
        x = xs[rank].detach().to(device).requires_grad_()
        y = group.all_to_all_single_4d(
            x, mode, f"t{mode}", seq_splits=seq, head_splits=heads, layout=layout
        )
        assert same_bits(y.detach().cpu(), outs[rank].detach()), f"{name} mode {mode} forward"
        (y.float() * weights[rank].to(device)).sum().backward()
        if not same_bits(x.grad.cpu(), xs[rank].grad):
            raise AssertionError(
                f"P={P} rank {rank} {name} mode={mode} {layout} {dtype}: "
                "x.grad differs from single-process autograd"
            )
        count += 1
    return count


def check_residual(group, P, device) -> None:
    x = torch.randn(1, 2, 2 * P, D, device=device, requires_grad=True)
    y = x + 2 * group.all_to_all_single_4d(group.all_to_all_single_4d(x, 0, "r0"), 1, "r1")
    y.sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3.0)), f"x.grad is {x.grad.unique()}, not 3"


def check_borrowed(group, P, device) -> None:
    x = torch.randn(1, 2, 2 * P, D, device=device, requires_grad=True)
    try:
        group.all_to_all_single_4d_borrowed(x, 0, "b")
    except ValueError as error:
        assert "requires grad" in str(error) and "all_to_all_single_4d" in str(error), error
    else:
        raise AssertionError("a borrowed call accepted an input that requires grad")
    with torch.no_grad():
        y = group.all_to_all_single_4d_borrowed(x, 0, "b")
        assert not y.requires_grad
        assert same_bits(y.cpu(), group.all_to_all_single_4d(x, 0, "b2").cpu())


def check_auto_tag(group, P, device) -> None:
    seq, heads = split_cases(P)[1][1:]
    x = torch.randn(1, seq[group.rank], sum(heads), D, device=device, requires_grad=True)
    tag = fu.auto_tag(x, 0, "bshd")
    tags = [None] * P
    dist.all_gather_object(tags, tag, group=group.process_group)
    assert len(set(tags)) == 1, f"ranks picked different tags: {tags}"
    y = group.all_to_all_single_4d(x, 0, None, seq_splits=seq, head_splits=heads)
    z = group.all_to_all_single_4d(y, 1, None, seq_splits=seq, head_splits=heads)
    z.sum().backward()
    assert same_bits(z.detach(), x.detach()) and torch.equal(x.grad, torch.ones_like(x))


def make(pg, shared_gpu):
    if shared_gpu:
        return fu.UlyssesGroup(pg, 1 << 20), torch.device("cuda", 0)
    return fu.TorchUlyssesGroup(pg), torch.device("cpu")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--shared-gpu",
        action="store_true",
        help="the fast group, every rank on cuda:0 (else TorchUlyssesGroup, CPU)",
    )
    args = parser.parse_args()

    def body(report, pg, P, _device):
        group, device = make(pg, args.shared_gpu)
        with report.check(f"grads_P{P}") as entry:
            entry["detail"] = f"{check_grads(group, P, device)} cases"
        for name, fn in (
            ("residual", check_residual),
            ("borrowed", check_borrowed),
            ("auto_tag", check_auto_tag),
        ):
            with report.check(f"{name}_P{P}"):
                fn(group, P, device)
        group.destroy()
        if dist.get_rank() == dist.get_world_size() - 1:
            print(f"P {P} ok", flush=True)

    return run_on_subgroups(args.shared_gpu, body)


def check_names(world: int, shared_gpu: bool = False) -> list[str]:
    """Every check a rank of a `world`-rank run reports, in order (for the last rank)."""
    return [
        f"{c}_P{P}"
        for P in subgroup_sizes(world, shared_gpu)
        for c in ("grads", "residual", "borrowed", "auto_tag")
    ]


if __name__ == "__main__":
    sys.exit(main())
