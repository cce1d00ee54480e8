"""GPU tests of CUDA-graph capture: P = 1..8 ranks sharing this machine's first
GPU over gloo (FAST_ULYSSES_ALLOW_SHARED_GPU=1), each run once as the worker
tests/workers/graph_correctness.py through the launch_ranks fixture (every entry point captured and
replayed, an eager result read in a capture, eager results unused across a replay, a captured
barrier refused while an eager barrier=False call is open, a captured attention layer, eager calls between replays, a tag's first owned call after
a capture, two graphs on one group, the capture-time error, torch.compile reduce-overhead, the
kernel census), with one test per check and P. They skip, saying why, where no GPU is visible."""

from __future__ import annotations

import re

import graph_correctness
import pytest
from _gpu import needs_gpu

NPROCS = (1, 2, 3, 4, 5, 8)
CHECKS = list(graph_correctness.CHECKS)
TIMEOUT_S = 300  # each P should take well under a minute on an H200; this only bounds a hang


@needs_gpu
@pytest.mark.parametrize("nproc,check", [(n, c) for n in NPROCS for c in CHECKS])
def test_graph_check(launch_ranks, nproc, check):
    launch_ranks("graph_correctness", nproc, timeout=TIMEOUT_S, shared_gpu=True).assert_check(check)


@needs_gpu
@pytest.mark.parametrize("nproc", NPROCS)
def test_graph_run_ends_cleanly(launch_ranks, nproc):
    """Every rank exits 0 after all its checks, and rank 0 prints the standalone summary."""
    run = launch_ranks("graph_correctness", nproc, timeout=TIMEOUT_S, shared_gpu=True)
    run.assert_clean_exit()
    assert run.check_names() == CHECKS, run.describe()
    assert re.search(rf"^{len(CHECKS)} passed, 0 failed$", run.ranks[0].output, re.MULTILINE), (
        run.describe()
    )
    print(run.ranks[0].output)
