"""patch_diffusers() on the fast group: tests/workers/diffusers_patch.py with --shared-gpu, P =
1, 2, 3 ranks sharing this machine's first GPU (UlyssesGroup over gloo), one launch per P (its
whole world: diffusers' mesh spans it), one test per check: the tiny WanTransformer3DModel under
diffusers' context parallelism (P >= 2; even and uneven heads, an uneven sequence) against one
process and diffusers' own, our group carrying every Ulysses all-to-all and torch none; the
attention alone with a mask and return_lse (every P). They skip, saying why, where no GPU is
visible or diffusers is not installed."""

from __future__ import annotations

import importlib.util

import diffusers_patch
import pytest
from _gpu import needs_gpu

NPROCS = (1, 2, 3)
TIMEOUT_S = 480
needs_diffusers = pytest.mark.skipif(
    importlib.util.find_spec("diffusers") is None,
    reason="diffusers is not installed (requirements/dev.txt)",
)


@needs_gpu
@needs_diffusers
@pytest.mark.parametrize(
    "nproc,check", [(n, c) for n in NPROCS for c in diffusers_patch.check_names(n, True)]
)
def test_diffusers_on_the_fast_group(launch_ranks, nproc, check):
    launch_ranks("diffusers_patch", nproc, timeout=TIMEOUT_S, shared_gpu=True).assert_check(check)


@needs_gpu
@needs_diffusers
@pytest.mark.parametrize("nproc", NPROCS)
def test_diffusers_run_ends_cleanly(launch_ranks, nproc):
    launch_ranks("diffusers_patch", nproc, timeout=TIMEOUT_S, shared_gpu=True).assert_clean_exit()
