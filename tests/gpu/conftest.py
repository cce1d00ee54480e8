"""One launch per (worker, P, arguments), shared by that launch's per-check tests; and the
import path of the launcher (tests/multirank.py) and the workers (tests/distributed, for their
check names)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "distributed"))

from _gpu import SHARED_GPU_ENV  # noqa: E402
from multirank import launch  # noqa: E402


@pytest.fixture(scope="session")
def shared_gpu_runs(tmp_path_factory):
    """run(worker, nproc, *args, timeout=...) launches `worker` once per (worker, nproc, args)
    with --shared-gpu and returns the cached Launch afterwards."""
    cache = {}

    def run(worker: Path, nproc: int, *args: str, timeout: float):
        key = (worker.name, nproc, args)
        if key not in cache:
            tmp = tmp_path_factory.mktemp(f"{worker.stem}-p{nproc}")
            cache[key] = launch(worker, nproc, tmp, timeout=timeout,
                                args=("--shared-gpu", *args), env=SHARED_GPU_ENV)
        return cache[key]

    return run
