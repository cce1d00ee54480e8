"""One rank of the TorchUlyssesGroup test (run by test_torch_group.py through multirank.py,
or by torchrun).

All ranks join one gloo world; for P = 1..world_size the last P ranks form a subgroup (so group
rank != global rank is exercised) and run every case against fast_ulysses.simulate, bit for bit,
as check "subgroup_P<p>" of the rank's report, and, as check "packed_views_P<p>", inputs given as
strided views (packed_views.py: a packed qkv projection's q, k or v, a sequence window, every
other batch element, a transpose) against the same call on the contiguous input. Inputs are seeded per (case, rank), so each rank
rebuilds every rank's input locally. After each P, a line "P <p> ok" is printed; the first
failure prints its traceback and exits 1.
"""

from __future__ import annotations

import itertools
import os
import sys

import packed_views
import torch
import torch.distributed as dist
from multirank import run_on_subgroups

import fast_ulysses
from fast_ulysses.factory import make_group
from fast_ulysses.plan import input_shape as plan_input_shape
from fast_ulysses.torch_group import TorchUlyssesGroup
from fast_ulysses.validation import CallSpec

# (dtype, b, d) triples: every dtype and both batch sizes, without their full product (2 cores),
# and fp32 with d = 1 (4-byte rows: the softmax LSE that hybrid Ulysses + Ring exchanges).
DTYPE_BATCH_DIM = ((torch.float16, 1, 8), (torch.bfloat16, 2, 8), (torch.float32, 2, 1))
LAYOUTS = ("bshd", "sbhd", "bhsd")


def split_cases(P: int):
    """(name, seq_splits, head_splits) covering even, uneven and zero-sized splits."""
    cases = [("even", None, None), ("even-explicit", [2] * P, [1] * P)]
    if P > 1:
        cases.append(("zero-rows", [(r * 2 + 1) % 4 if r else 0 for r in range(P)], [2] * P))
        cases.append(("zero-heads", [3] * P, [0] + [2] * (P - 1)))
    if P == 8:
        cases.append(("wan-1.3b", [5, 3, 0, 4, 4, 4, 4, 1], [2, 2, 2, 2, 1, 1, 1, 1]))
    if P == 5:
        cases.append(("hunyuan", [3, 3, 3, 3, 2], [5, 5, 5, 5, 4]))
    return cases


def input_shape(mode, layout, b, d, rank, P, seq, heads):
    """Rank `rank`'s input shape, from the plan; None splits mean 2 rows and 2 heads per rank."""
    return plan_input_shape(
        P,
        rank,
        mode,
        batch=b,
        head_dim=d,
        seq_splits=seq or [2] * P,
        head_splits=heads or [2] * P,
        layout=layout,
    )


def make_input(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 100).to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8),
            b.contiguous().reshape(-1).view(torch.uint8),
        )
    )


def check_cases(group: TorchUlyssesGroup, P: int) -> int:
    rank, count = group.rank, 0
    for (name, seq, heads), mode, layout, (dtype, b, d) in itertools.product(
        split_cases(P), (0, 1), LAYOUTS, DTYPE_BATCH_DIM
    ):
        seed = 100_000 * P + 1000 * count
        inputs = [
            make_input(input_shape(mode, layout, b, d, r, P, seq, heads), dtype, seed + r)
            for r in range(P)
        ]
        kw = dict(seq_splits=seq, head_splits=heads, layout=layout)
        expected = fast_ulysses.simulate(inputs, mode, **kw)[rank]
        if count % 2:
            got = group.all_to_all_single_4d_borrowed(inputs[rank], mode, "t", barrier=False, **kw)
            group.barrier()
        else:
            got = group.all_to_all_single_4d(inputs[rank], mode, "t", **kw)
        if not same_bits(got, expected):
            raise AssertionError(
                f"P={P} rank {rank} case {name} mode={mode} {layout} "
                f"{dtype} b={b} d={d}: output differs from simulate "
                f"(shapes {tuple(got.shape)} vs {tuple(expected.shape)})"
            )
        count += 1
    return count


def check_packed_views(group: TorchUlyssesGroup, P: int) -> int:
    """Every packing of packed_views, modes 0 and 1, every layout, uneven splits: the owned,
    borrowed and out= calls on the strided view give, bit for bit, the owned call on the
    contiguous input, and simulate. (Splits differ per rank, and so do the packings: the strides
    are each rank's own.)"""
    rank, count = group.rank, 0
    seq = [(2 * r + 1) % 4 for r in range(P)] if P > 1 else [3]
    heads = [1 + r % 2 for r in range(P)]
    for mode, layout in itertools.product((0, 1), LAYOUTS):
        kw = dict(seq_splits=seq, head_splits=heads, layout=layout)
        for k in range(len(packed_views.PACKINGS)):
            # Each rank picks its own packing (and q, k or v): the strides are rank-local.
            packing = packed_views.PACKINGS[(k + rank) % len(packed_views.PACKINGS)]
            seed = 7_000_000 + 10_000 * P + 100 * count
            inputs = [
                make_input(
                    input_shape(mode, layout, 2, 8, r, P, seq, heads), torch.bfloat16, seed + r
                )
                for r in range(P)
            ]
            x = inputs[rank]
            view = packed_views.packed(x, layout, packing, rank % 3)
            want = group.all_to_all_single_4d(x, mode, "packed", **kw)
            if count % 3 == 0:
                got = group.all_to_all_single_4d(view, mode, "packed", **kw)
            elif count % 3 == 1:
                got = group.all_to_all_single_4d_borrowed(view, mode, "packed-b", **kw).clone()
            else:
                got = torch.full_like(want, 3.0)
                group.all_to_all_single_4d(view, mode, "packed", out=got, **kw)
            expected = fast_ulysses.simulate(inputs, mode, **kw)[rank]
            if not (same_bits(got, want) and same_bits(want, expected)):
                raise AssertionError(
                    f"P={P} rank {rank} mode={mode} {layout} {packing} (strides "
                    f"{view.stride()}): the packed view's output differs from the contiguous "
                    "input's"
                )
            count += 1
    return count


def bad_calls(P: int):
    """Calls every rank gets wrong the same way: (mode, shape, kwargs)."""
    calls = [
        (2, (1, 2, 2 * P, 8), {}),
        (0, (1, 2, 2 * P, 8), {"layout": "bsdh"}),
        (0, (1, 2, 2 * P, 8), {"seq_splits": [2] * (P + 1)}),
        (1, (1, 2 * P, 2, 8), {"head_splits": [3] * P}),
        (1, (1, 2, 2 * P, 8), {"layout": "bhsd", "seq_splits": [3] * P}),
    ]
    if P > 1:
        calls.append((0, (1, 2, P + 1, 8), {}))  # heads that P does not divide
    return calls


def check_errors(group: TorchUlyssesGroup, P: int) -> None:
    for mode, shape, kw in bad_calls(P):
        x = torch.zeros(shape, dtype=torch.bfloat16)
        try:
            fast_ulysses.plan(P, group.rank, mode, shape, x.dtype, **kw)
        except ValueError as error:
            want = str(error)
        else:
            raise AssertionError(f"plan accepted the bad call {mode} {shape} {kw}")
        for call in (group.all_to_all_single_4d, group.all_to_all_single_4d_borrowed):
            try:
                call(x, mode, "t", **kw)
            except ValueError as error:
                if str(error) != want:
                    raise AssertionError(f"{call.__name__}: {error!s} != plan's {want}") from None
            else:
                raise AssertionError(f"{call.__name__} accepted {mode} {shape} {kw}")


def check_reserve_and_destroy(group: TorchUlyssesGroup, P: int) -> None:
    group.reserve(
        [
            CallSpec((1, 2, 2 * P, 8), torch.bfloat16, 0, "q"),
            CallSpec((1, 2 * P, 2, 8), torch.bfloat16, 1, "o"),
        ]
    )
    try:
        group.reserve([CallSpec((1, 2, P + 1, 8), torch.bfloat16, 0, "q")] if P > 1 else [1])
    except ValueError:
        pass
    else:
        raise AssertionError("reserve accepted a call the plan rejects")
    group.destroy()
    x = torch.zeros(1, 2, 2 * P, 8, dtype=torch.bfloat16)
    for use in (
        lambda: group.all_to_all_single_4d(x, 0, "q"),
        group.barrier,
        lambda: group.all_to_all_single_4d_borrowed(x, 0, "q"),
        lambda: group.reserve([]),
    ):
        try:
            use()
        except RuntimeError:
            continue
        raise AssertionError("a call after destroy() did not raise RuntimeError")


def check_make_group(pg) -> None:
    """make_group gathers the topology over the subgroup; CPU-only ranks get the fallback. A
    setting refused on the group's last rank only, or FAST_ULYSSES_DEBUG=1 there only, is every
    rank's ValueError (none is left waiting), naming that rank. FAST_ULYSSES_DEBUG=1 there only
    is refused the same way by a TorchUlyssesGroup built directly and by make_group(prefer=
    "torch"), which gather no topology, and so is a refused FAST_ULYSSES_DEBUG value on the last
    rank only (the other ranks would otherwise wait for it in the group's gather)."""
    group = make_group(pg, 1 << 20)
    assert isinstance(group, TorchUlyssesGroup) and group.fallback
    if not torch.cuda.is_available():
        assert group.fallback_reason == "no GPU on rank 0", group.fallback_reason
    P, last = dist.get_world_size(pg), dist.get_world_size(pg) - 1
    others = "rank 0" if P == 2 else f"ranks 0-{last - 1}" if P > 3 else "ranks 0, 1"
    debug_want = (
        f"FAST_ULYSSES_DEBUG=1 on rank {last} but not on {others}: set it the same on every rank"
        if P > 1
        else None
    )
    for name, value, want, build, how in (
        (
            "FAST_ULYSSES_WATCHDOG_S",
            "soon",
            f"rank {last}: FAST_ULYSSES_WATCHDOG_S=soon: must be a number of seconds",
            lambda: make_group(pg, 1 << 20),
            "make_group",
        ),
        ("FAST_ULYSSES_DEBUG", "1", debug_want, lambda: make_group(pg, 1 << 20), "make_group"),
        (
            "FAST_ULYSSES_DEBUG",
            "1",
            debug_want,
            lambda: make_group(pg, prefer="torch"),
            "make_group(prefer='torch')",
        ),
        ("FAST_ULYSSES_DEBUG", "1", debug_want, lambda: TorchUlyssesGroup(pg), "TorchUlyssesGroup"),
        (
            "FAST_ULYSSES_DEBUG",
            "yes",
            f"rank {last}: FAST_ULYSSES_DEBUG=yes: must be 0",
            lambda: TorchUlyssesGroup(pg),
            "TorchUlyssesGroup",
        ),
    ):
        saved = os.environ.get(name)
        if dist.get_rank(pg) == last:
            os.environ[name] = value
        try:
            build()
        except ValueError as error:
            assert want is not None and str(error).startswith(want), (
                f"{how} raised {error!r}, expected {want!r}..."
            )
        else:
            assert want is None, f"{how} did not raise for {name}={value} on group rank {last}"
        finally:
            if saved is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = saved


def main() -> int:
    def body(report, pg, P, _device):
        rank, W = dist.get_rank(), dist.get_world_size()
        with report.check(f"subgroup_P{P}") as entry:
            check_make_group(pg)
            group = TorchUlyssesGroup(pg)
            assert group.rank == rank - (W - P) and group.world_size == P
            n = check_cases(group, P)
            check_errors(group, P)
            check_reserve_and_destroy(group, P)
            entry["detail"] = f"{n} cases"
        with report.check(f"packed_views_P{P}") as entry:
            packed = check_packed_views(TorchUlyssesGroup(pg), P)
            entry["detail"] = f"{packed} packed-view calls"
        print(f"P {P} ok ({n} cases, {packed} packed-view calls)", flush=True)

    return run_on_subgroups(False, body, timeout_s=60)


if __name__ == "__main__":
    sys.exit(main())
