"""The fused QK RMSNorm + RoPE scatter on UlyssesGroup, ranks sharing one GPU: one pytest test per
(P, check) of tests/distributed/fused_correctness.py; skipped without a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

import fused_correctness
from _gpu import needs_gpu

WORKER = Path(fused_correctness.__file__)
NPROCS = (1, 2, 3, 8)


@needs_gpu
@pytest.mark.parametrize("nproc,check", [(n, c) for n in NPROCS
                                         for c in fused_correctness.CHECKS])
def test_fused_check(shared_gpu_runs, nproc, check):
    shared_gpu_runs(WORKER, nproc, timeout=300).assert_check(check)


@needs_gpu
@pytest.mark.parametrize("nproc", NPROCS)
def test_fused_run_ends_cleanly(shared_gpu_runs, nproc):
    run = shared_gpu_runs(WORKER, nproc, timeout=300)
    run.assert_clean_exit()
    print(run.ranks[0].output)
