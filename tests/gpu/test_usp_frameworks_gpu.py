"""The frameworks' own Ulysses x Ring (USP) attention with fast-ulysses' patches on ranks sharing
this machine's first GPU (tests/workers/usp_frameworks.py with --shared-gpu, 4 ranks, ring 2 x
Ulysses 2, bfloat16): diffusers' ring x ulysses context parallelism with its `_native_flash`
backend (the CUDA flash kernel), yunchang's LongContextAttention and xDiT's USP() with their
torch flash attention, and xDiT's xFuserLongContextAttention, which xDiT defines only where
CUDA is available (the CPU tests cannot run it). Each bit for bit against the framework's own
run, our group carrying every Ulysses all-to-all. They skip, saying why, where no GPU is visible
or a package is not importable (scripts/device.sh installs them)."""

from __future__ import annotations

import pytest
import usp_frameworks as worker
from _gpu import needs_gpu

TIMEOUT_S = 480
MISSING = {f: worker.missing(f) for f in worker.FRAMEWORKS}
PRESENT = [f for f, reason in MISSING.items() if not reason]


@pytest.fixture(scope="module")
def ranks(launch_ranks):
    if not PRESENT:
        pytest.skip("; ".join(MISSING.values()))
    args = ("--frameworks", ",".join(PRESENT))
    return launch_ranks("usp_frameworks", worker.WORLD, *args, timeout=TIMEOUT_S, shared_gpu=True)


@needs_gpu
@pytest.mark.parametrize("framework", worker.FRAMEWORKS)
def test_usp_under_the_patch_on_the_gpu(ranks, framework):
    if MISSING[framework]:
        pytest.skip(MISSING[framework])
    ranks.assert_check(worker.check_names([framework])[0])


@needs_gpu
def test_usp_run_ends_cleanly(ranks):
    ranks.assert_clean_exit()
