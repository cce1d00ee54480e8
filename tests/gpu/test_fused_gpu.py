"""The fused QK RMSNorm + RoPE scatter on UlyssesGroup, ranks sharing one GPU: one pytest test per
(P, check) of tests/workers/fused_correctness.py; skipped without a GPU."""

from __future__ import annotations

import fused_correctness
import pytest
from _gpu import needs_gpu

NPROCS = (1, 2, 3, 8)


@needs_gpu
@pytest.mark.parametrize("nproc,check", [(n, c) for n in NPROCS for c in fused_correctness.CHECKS])
def test_fused_check(launch_ranks, nproc, check):
    launch_ranks("fused_correctness", nproc, timeout=300, shared_gpu=True).assert_check(check)


@needs_gpu
@pytest.mark.parametrize("nproc", NPROCS)
def test_fused_run_ends_cleanly(launch_ranks, nproc):
    run = launch_ranks("fused_correctness", nproc, timeout=300, shared_gpu=True)
    run.assert_clean_exit()
    print(run.ranks[0].output)
