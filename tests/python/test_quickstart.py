"""README's main job, examples/quickstart.py, runs and checks itself on this machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.py"


def test_quickstart_runs_and_checks_itself():
    result = subprocess.run(
        [sys.executable, str(QUICKSTART)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "equals fast_ulysses.simulate bit for bit: True" in result.stdout
    if not torch.cuda.is_available():
        assert "torch.distributed fallback" in result.stdout and "no GPU" in result.stdout
    assert "12,096,000 bytes" in result.stdout


@pytest.mark.full
def test_quickstart_under_torchrun_runs_once_on_the_launched_ranks():
    """Under torchrun the example is one rank each (before, each launched process ran the whole
    job, spawning its own 4 ranks): one summary, for the 2 launched ranks."""
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
        + [str(QUICKSTART)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("bit for bit: True") == 1, result.stdout
    assert "2 ranks on CPU" in result.stdout, result.stdout


LAYER = QUICKSTART.with_name("ulysses_layer.py")


def test_readme_quick_start_is_the_layer_example():
    """README's Quick start block is examples/ulysses_layer.py from its first import on, so the
    code a user copies is the code this file runs."""
    readme = (QUICKSTART.parents[1] / "README.md").read_text()
    code = LAYER.read_text()
    assert code[code.index("import sys") :] in readme


def _layer_ran_on_3_ranks(result) -> None:
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(3):
        line = f"rank {rank}: q (1, 768, 4, 64) -> attention -> out (1, 256, 12, 64)"
        assert line in result.stdout, result.stdout + result.stderr


def test_layer_example_starts_its_own_ranks():
    """`python examples/ulysses_layer.py --nproc 3`, the way every example starts (before, it
    needed torchrun's RANK): 12 heads, 4 on each rank; every rank's q is head-sharded over the
    whole sequence and its output is back to its sequence shard."""
    result = subprocess.run(
        [sys.executable, str(LAYER), "--nproc", "3"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )
    _layer_ran_on_3_ranks(result)


@pytest.mark.full
def test_layer_example_runs_under_torchrun():
    """The same under torchrun, on the 3 ranks it launched."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "3",
            str(LAYER),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )
    _layer_ran_on_3_ranks(result)
