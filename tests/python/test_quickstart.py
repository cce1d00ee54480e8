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
