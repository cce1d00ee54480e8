"""patch_diffusers() on the fast group: tests/python/_diffusers_worker.py with --shared-gpu, P =
1, 2, 3 ranks sharing this machine's first GPU (UlyssesGroup over gloo), one launch per P (its
whole world: diffusers' mesh spans it), one test per check: the tiny WanTransformer3DModel under
diffusers' context parallelism (P >= 2; even and uneven heads, an uneven sequence) against one
process and diffusers' own, our group carrying every Ulysses all-to-all and torch none; the
attention alone with a mask and return_lse (every P). They skip, saying why, where no GPU is
visible or diffusers is not installed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from _gpu import needs_gpu

PYTHON_TESTS = Path(__file__).resolve().parents[1] / "python"
sys.path.insert(0, str(PYTHON_TESTS))

import _diffusers_worker  # noqa: E402

NPROCS = (1, 2, 3)
TIMEOUT_S = 480
WORKER = Path(_diffusers_worker.__file__)
needs_diffusers = pytest.mark.skipif(importlib.util.find_spec("diffusers") is None,
                                     reason="diffusers is not installed (requirements/dev.txt)")


@needs_gpu
@needs_diffusers
@pytest.mark.parametrize("nproc,check", [(n, c) for n in NPROCS
                                         for c in _diffusers_worker.check_names(n, True)])
def test_diffusers_on_the_fast_group(shared_gpu_runs, nproc, check):
    shared_gpu_runs(WORKER, nproc, timeout=TIMEOUT_S).assert_check(check)


@needs_gpu
@needs_diffusers
@pytest.mark.parametrize("nproc", NPROCS)
def test_diffusers_run_ends_cleanly(shared_gpu_runs, nproc):
    shared_gpu_runs(WORKER, nproc, timeout=TIMEOUT_S).assert_clean_exit()
