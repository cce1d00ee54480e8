"""Fixtures shared by the CPU and GPU tests: `launch_ranks`, the one way a test starts a
multi-rank worker (tests/workers), and `world1`, a one-rank gloo world in this process.

tests/workers goes on sys.path here, so a test imports a worker module for its check names
(`import graph_correctness`) and the launcher as `multirank`. The workers are scripts, not
tests: pytest does not collect that folder."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent / "workers"))

from multirank import SHARED_GPU_ENV, launch, worker_path  # noqa: E402

collect_ignore = ["workers"]


@pytest.fixture(scope="session")
def launch_ranks(tmp_path_factory):
    """launch_ranks(worker, nproc, *args, timeout, shared_gpu=False, env=None, nodes=1)
    -> multirank.Launch

    Runs `worker` (a name in tests/workers, or a path) as `nproc` ranks, once per (worker, nproc,
    args, shared_gpu, env, nodes) in the session: the per-check tests of one launch share it.
    Plain: gloo CPU ranks. shared_gpu: every rank on the first GPU (the worker gets --shared-gpu
    and SHARED_GPU_ENV). `env` goes on top (a None value removes a variable). nodes=N: the ranks
    run as N simulated nodes of consecutive ranks (torchrun's GROUP_RANK, LOCAL_RANK, ... of
    each; multirank.node_env). Each rank's output is
    in <tmp>/<worker>-p<nproc>*/rank<r>.log; the Launch says which check broke on which rank."""
    cache = {}

    def run(
        worker,
        nproc: int,
        *args: str,
        timeout: float,
        shared_gpu: bool = False,
        env: dict | None = None,
        nodes: int = 1,
    ):
        script = worker_path(worker)
        key = (script, nproc, args, shared_gpu, tuple(sorted((env or {}).items())), nodes)
        if key not in cache:
            tmp = tmp_path_factory.mktemp(f"{script.stem}-p{nproc}")
            if shared_gpu:
                args, env = ("--shared-gpu", *args), dict(SHARED_GPU_ENV, **(env or {}))
            cache[key] = launch(
                script, nproc, tmp, timeout=timeout, args=args, env=env, nodes=nodes
            )
        return cache[key]

    return run


@pytest.fixture(scope="session")
def world1(tmp_path_factory):
    """The default process group as a one-rank gloo world (reused if one already exists)."""
    if dist.is_initialized():
        if dist.get_world_size() != 1:
            pytest.skip("this process already runs a multi-rank default group")
        yield dist.group.WORLD
        return
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # nothing leaves the machine
    store = tmp_path_factory.mktemp("world1") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield dist.group.WORLD
    dist.destroy_process_group()
