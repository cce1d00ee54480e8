"""One rank of test_debug_mode.py (run through multirank.py, or by torchrun): a gloo world
of 3 CPU ranks and TorchUlyssesGroup.

Checks (each a `Report.check`):
  debug_head_splits   FAST_ULYSSES_DEBUG=1: rank 0 passes other head_splits than ranks 1, 2;
                      every rank raises ValueError naming both calls
  debug_mode          the same for a mode that differs (rank 0: Mode.HEAD_TO_SEQ, others: 0)
  debug_invalid       the same for a call invalid on rank 1 only (an empty tag), and on rank 2
                      only (24-byte rows)
  debug_agreed        Mode.SEQ_TO_HEAD on rank 0 and 0 elsewhere agree: the call runs, equal to
                      simulate; after every refused call the group still works
  dropped_results     debug off: results of both entry points, both layouts and both modes are
                      never used; the rank then exits (the test reads its stderr)
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from multirank import Report

import fast_ulysses as fu

WORLD = 3


def seeded(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g).to(torch.bfloat16)


def expect_refused(call, *needles) -> str:
    """Runs `call`, which must raise ValueError containing every needle; returns the message."""
    try:
        call()
    except ValueError as error:
        text = str(error)
        missing = [n for n in needles if n not in text]
        assert not missing, f"{missing} not in: {text}"
        return text
    raise AssertionError(f"the call was not refused (expected {needles})")


def agreed_call(group, rank, seed) -> None:
    """A call every rank makes alike; its result must equal simulate's."""
    inputs = [seeded((1, 2, 3, 8), seed + r) for r in range(WORLD)]
    mode = fu.Mode.SEQ_TO_HEAD if rank == 0 else 0
    got = group.all_to_all_single_4d(inputs[rank], mode, "agreed")
    assert torch.equal(got, fu.simulate(inputs, 0)[rank]), "agreed call: wrong result"


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    assert dist.get_world_size() == WORLD
    report = Report(rank)
    os.environ["FAST_ULYSSES_DEBUG"] = "1"
    group = fu.TorchUlyssesGroup()
    del os.environ["FAST_ULYSSES_DEBUG"]

    with report.check("debug_head_splits"):
        heads = [2, 1, 1] if rank == 0 else [1, 2, 1]
        x = seeded((1, 2, 4, 8), rank)
        for entry in (group.all_to_all_single_4d, group.all_to_all_single_4d_borrowed):
            expect_refused(
                lambda: entry(x, 0, "q", head_splits=heads),
                "differs across ranks",
                "head_splits=[2, 1, 1]",
                "head_splits=[1, 2, 1]",
                entry.__name__,
            )
        agreed_call(group, rank, 10)

    with report.check("debug_mode"):
        call = (
            (
                lambda: group.all_to_all_single_4d(
                    seeded((1, 6, 1, 8), rank), fu.Mode.HEAD_TO_SEQ, "o"
                )
            )
            if rank == 0
            else (lambda: group.all_to_all_single_4d(seeded((1, 2, 3, 8), rank), 0, "o"))
        )
        expect_refused(call, "differs across ranks", "rank 0 called", "mode=1", "mode=0")
        agreed_call(group, rank, 20)

    with report.check("debug_invalid"):
        x = seeded((1, 2, 3, 8), rank)
        expect_refused(
            lambda: group.all_to_all_single_4d(x, 0, "" if rank == 1 else "q"),
            "rank 1 called all_to_all_single_4d(",
            "tag=''",
            "which is invalid",
            "tag is '': a tag must be a non-empty str",
        )
        bad = x.double() if rank == 2 else x  # 8-byte elements on rank 2
        expect_refused(
            lambda: group.all_to_all_single_4d_borrowed(bad, 0, "q"),
            "rank 2 called all_to_all_single_4d_borrowed(x=(1, 2, 3, 8)",
            "which is invalid",
            "element size must be 1, 2 or 4 bytes",
        )
        agreed_call(group, rank, 30)

    with report.check("debug_agreed"):
        agreed_call(group, rank, 40)
        assert group.stats()["tags"] == 1, group.stats()  # refused calls used no tag

    with report.check("dropped_results"):
        quiet = fu.TorchUlyssesGroup()
        for layout in ("bshd", "sbhd"):
            for b in (1, 2):
                x0 = seeded((b, 2, 3, 8) if layout == "bshd" else (2, b, 3, 8), rank)
                x1 = seeded((b, 6, 1, 8) if layout == "bshd" else (6, b, 1, 8), rank)
                quiet.all_to_all_single_4d(x0, 0, "q", layout=layout)
                quiet.all_to_all_single_4d_borrowed(x0, 0, "k", layout=layout)
                quiet.all_to_all_single_4d(x1, 1, "o", layout=layout)
        dist.barrier()
    report.finish()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
