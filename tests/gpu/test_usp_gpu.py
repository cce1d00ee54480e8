"""Ulysses x Ring on ranks sharing this machine's first GPU: tests/workers/usp.py with
--shared-gpu at P = 4 (2 ring x 2 Ulysses) and 8 (4 x 2, 2 x 4), one launch per layout (each
rank's processes allocate on one Ulysses group: docs/API.md, "Process groups"), one test per
check. The Ulysses all-to-alls go through the registry's group for each Ulysses ProcessGroup; the
ring's point-to-point calls go through gloo (staged through the host: gloo sends CPU tensors);
the block kernel is CUDA's memory-efficient attention. Skips, saying why, where no GPU is
visible."""

from __future__ import annotations

import pytest
import usp
from _gpu import needs_gpu

LAYOUTS = ("2x2", "4x2", "2x4")  # R x U
TIMEOUT_S = 480


def _nproc(layout):
    R, U = (int(n) for n in layout.split("x"))
    return R * U


def _launch(launch_ranks, layout):
    return launch_ranks(
        "usp", _nproc(layout), "--layout", layout, timeout=TIMEOUT_S, shared_gpu=True
    )


@needs_gpu
@pytest.mark.parametrize(
    "layout,check", [(lay, c) for lay in LAYOUTS for c in usp.check_names(_nproc(lay), lay)]
)
def test_usp_shared_gpu_check(launch_ranks, layout, check):
    _launch(launch_ranks, layout).assert_check(check)


@needs_gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_usp_shared_gpu_run_ends_cleanly(launch_ranks, layout):
    _launch(launch_ranks, layout).assert_clean_exit()
