"""examples/wan_block.py at a small size on this machine: 3 ranks against one, 5 heads (uneven
on 3 ranks) and a 10-token sequence (uneven too); forward, gradients and 3 SGD steps' losses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import torch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wan_block.py"


def test_wan_block_matches_one_rank():
    result = subprocess.run([sys.executable, str(EXAMPLE), "--heads", "5", "--head-dim", "8",
                             "--seq", "10", "--steps", "3", "--nproc", "3"],
                            capture_output=True, text=True, timeout=300)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert re.search(r"every check within \S+: True", result.stdout), out
    if not torch.cuda.is_available():
        assert "3 ranks on CPU (gloo), float32" in result.stdout, out
        assert "head_splits [2, 2, 1]" in result.stdout and "seq_splits [4, 3, 3]" in out
    for name in ("forward", "x.grad", "weight grads", "losses"):
        assert re.search(rf"^  {re.escape(name)} +max relative difference", result.stdout,
                         re.MULTILINE), out
