"""README's main job, examples/quickstart.py, runs and checks itself on this machine."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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


def test_quickstart_takes_no_arguments():
    """It has no options (the machine decides the ranks): an argument is a usage error, not
    silently ignored."""
    result = subprocess.run(
        [sys.executable, str(QUICKSTART), "--nproc", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    assert (
        result.stderr.strip().splitlines()[-1]
        == "quickstart.py: error: unrecognized arguments: --nproc 3"
    )


LAYER = QUICKSTART.with_name("ulysses_layer.py")


def test_readme_quick_start_is_the_layer_example():
    """README's Quick start block is examples/ulysses_layer.py from its first import on, so the
    code a user copies is the code this file runs."""
    readme = (QUICKSTART.parents[1] / "README.md").read_text()
    code = LAYER.read_text()
    assert code[code.index("import os") :] in readme


def test_layer_example_runs_under_torchrun():
    """examples/ulysses_layer.py on 3 ranks (12 heads: 4 each): every rank's q is head-sharded
    over the whole sequence and its output is back to its sequence shard."""
    if torch.cuda.is_available():
        import pytest

        pytest.skip("with a GPU the example takes one rank per GPU; here it runs on CPU ranks")
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
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for rank in range(3):
        line = f"rank {rank}: q (1, 768, 4, 64) -> attention -> out (1, 256, 12, 64)"
        assert line in result.stdout, result.stdout + result.stderr
