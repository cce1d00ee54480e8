"""Fixtures shared by the CPU tests: a one-rank gloo world in this process."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

# tests/multirank.py: the launcher every multi-rank test uses.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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
