"""Fixtures shared by the CPU and GPU tests: a one-rank gloo world in this process, made once per
pytest session (torch allows one default process group per process)."""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist


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
