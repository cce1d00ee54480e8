"""The fast path's packed-view check (a2a_correctness.py's "packed_views"): inputs given as strided
views (packed_views.py: a packed qkv projection's q, k or v, a sequence window, every other batch
element; each rank its own packing, as the strides are rank-local) move as they stand, and give
bit for bit the same call on the contiguous input, which itself equals simulate; owned, out= and
borrowed results, modes 0 and 1, every layout, uneven splits with zero rows. Allocations (the
caching allocator's count) show what moved: a regular view allocates exactly what the contiguous
call does, an irregular one (a transpose) exactly one tensor more, its .contiguous() copy."""

from __future__ import annotations

import itertools

import packed_views
import torch
from a2a_checks import LAYOUTS, Case, balanced, inputs_for

import fast_ulysses as fu


def _allocations(device, call) -> int:
    """Tensors the caching allocator handed out during `call()`."""
    key = "allocation.all.allocated"
    before = torch.cuda.memory_stats(device).get(key, 0)
    call()
    return torch.cuda.memory_stats(device).get(key, 0) - before


def _uneven(P: int) -> tuple:
    seq = tuple((3 * i + 1) % 5 for i in range(P))
    return seq if sum(seq) else (3,) * P


def check_results(checker) -> int:
    """Every layout and mode: each rank's packing's owned, out= and borrowed results against the
    contiguous input's owned result (and it against simulate). Returns the calls checked."""
    group, rank, P, device = checker.group, checker.rank, checker.P, checker.device
    calls = 0
    for (mode, layout), k in itertools.product(
        itertools.product((0, 1), LAYOUTS), range(len(packed_views.REGULAR))
    ):
        case = Case(2, _uneven(P), balanced(2 * P + 1, P), 64, torch.bfloat16, layout)
        splits = checker.splits(case)
        xs = inputs_for(case, P, seed=900 + 10 * k + mode, mode=mode)
        x = xs[rank].to(device)
        want = group.all_to_all_single_4d(x, mode, "packed", **splits)
        name = f"mode {mode} {layout}"
        checker.expect(
            f"{name}: contiguous input vs simulate", want, fu.simulate(xs, mode, **splits)[rank]
        )
        packing = packed_views.REGULAR[(k + rank) % len(packed_views.REGULAR)]
        view = packed_views.packed(x, layout, packing, rank % 3)
        name += f" {packing} (strides {view.stride()})"
        want = want.cpu()
        checker.expect(
            f"{name} owned", group.all_to_all_single_4d(view, mode, "packed", **splits), want
        )
        out = torch.full(want.shape, 3.0, dtype=want.dtype, device=device)
        group.all_to_all_single_4d(view, mode, "packed", out=out, **splits)
        checker.expect(f"{name} out=", out, want)
        borrowed = group.all_to_all_single_4d_borrowed(view, mode, "packed-b", **splits)
        checker.expect(f"{name} borrowed", borrowed, want)
        calls += 3
    return calls


def check_copies(checker) -> str:
    """A regular view allocates what the contiguous input does (it moves as it stands); an
    irregular one (transposed, more than one head and row) one tensor more (copied once); both
    bit-exact. Borrowed calls (no result allocated), each measured after a warm-up call."""
    group, rank, P, device = checker.group, checker.rank, checker.P, checker.device
    counts = []
    for layout in LAYOUTS:
        case = Case(2, (4,) * P, (2,) * P, 64, torch.bfloat16, layout)
        splits = checker.splits(case)
        xs = inputs_for(case, P, seed=950)
        x = xs[rank].to(device)
        want = fu.simulate(xs, 0, **splits)[rank]
        for packing in ("contiguous", "qkv_view", "transposed"):
            view = x if packing == "contiguous" else packed_views.packed(x, layout, packing)
            assert packed_views.moves_as_it_stands(x, layout, packing) == (
                packing != "transposed"
            ), f"rank {rank}: {layout} {packing}: the test's own prediction of the stride rule"
            results = []

            def call(view=view, results=results):
                results.append(
                    group.all_to_all_single_4d_borrowed(view, 0, "packed-copies", **splits)
                )

            call()  # warm-up: the tag's window, the plan, any cached graph
            checker.expect(f"{layout} {packing} borrowed (warm-up)", results[-1], want)
            counts.append(_allocations(device, call))
            checker.expect(f"{layout} {packing} borrowed", results[-1], want)
        contiguous, regular, irregular = counts[-3:]
        assert regular == contiguous and irregular == contiguous + 1, (
            f"rank {rank}: {layout}: allocations per call: contiguous {contiguous}, qkv view "
            f"{regular} (want the same), transposed {irregular} (want one more)"
        )
    return f"allocations per call (contiguous, qkv view, transposed) {counts[:3]}"


def check_packed_views(checker) -> None:
    calls = check_results(checker)
    copies = check_copies(checker)
    checker.passed.append(
        f"packed views: {calls} owned/out=/borrowed calls on strided views equal the contiguous "
        f"input's; {copies}"
    )
