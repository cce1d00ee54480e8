"""examples/wan_block.py at a small size on this machine: 3 ranks against one, 5 heads (uneven
on 3 ranks) and a 10-token sequence (uneven too); forward, gradients and 3 SGD steps' losses."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from example_runner import refuse

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wan_block.py"


@pytest.mark.full  # a training run; the fast tier's multi-rank checks of it: attention, autograd
def test_wan_block_matches_one_rank():
    result = subprocess.run(
        [
            sys.executable,
            str(EXAMPLE),
            "--heads",
            "5",
            "--head-dim",
            "8",
            "--seq",
            "10",
            "--steps",
            "3",
            "--nproc",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert re.search(r"every check within \S+: True", result.stdout), out
    if not torch.cuda.is_available():
        assert "3 ranks on CPU (gloo), float32" in result.stdout, out
        assert "head_splits [2, 2, 1]" in result.stdout and "seq_splits [4, 3, 3]" in out
    for name in ("forward", "x.grad", "weight grads", "losses"):
        assert re.search(
            rf"^  {re.escape(name)} +max relative difference", result.stdout, re.MULTILINE
        ), out


CPU_RANKS = pytest.mark.skipif(
    torch.cuda.is_available(), reason="with a GPU, --nproc 3 needs 3 GPUs (one rank per GPU)"
)


def _assert_usage_error(result, *expected: str) -> None:
    """Exit 2 before any rank starts: nothing on stdout, no traceback, argparse's usage lines
    and then one error line naming the argument."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("usage: ") and all(line.startswith(" ") for line in lines[1:-1]), (
        result.stderr
    )
    assert lines[-1].startswith("wan_block.py: error: "), result.stderr
    for text in expected:
        assert text in lines[-1], (text, lines[-1])


@pytest.mark.parametrize(
    "argv,expected",
    [
        (["--nproc", "0"], ["argument --nproc: '0' is out of range: it must be in [1, 8]"]),
        (["--nproc", "9"], ["argument --nproc: '9' is out of range: it must be in [1, 8]"]),
        (["--nproc", str(2**63)], ["argument --nproc: ", "is out of range"]),
        (["--nproc", "2.0"], ["argument --nproc: '2.0' is not an integer (e.g. 3)"]),
        (["--heads", "0"], ["argument --heads: '0' is out of range: it must be >= 1"]),
        (["--batch", "-1"], ["argument --batch: '-1' is out of range: it must be >= 1"]),
        (["--steps", "0"], ["argument --steps: '0' is out of range: it must be >= 1"]),
        (["--seq", "True"], ["argument --seq: 'True' is not an integer"]),
        (["--lr", "nan"], ["argument --lr: 'nan' is not a finite number"]),
        (["--head-dim", "7"], ["--head-dim is 7: it must be even"]),
        pytest.param(
            ["--heads", "2", "--nproc", "3"],
            ["--heads is 2: it must be at least the 3 ranks"],
            marks=CPU_RANKS,
        ),
        pytest.param(
            ["--seq", "2", "--nproc", "3"],
            ["--seq is 2: it must be at least the 3 ranks"],
            marks=CPU_RANKS,
        ),
        (
            ["--heads", "1000000", "--head-dim", "100000", "--nproc", "1"],
            ["--heads 1000000 --head-dim 100000: a projection weight is ", "at most 2^50 bytes"],
        ),
    ],
)
def test_wan_block_refuses_a_bad_argument_by_name(argv, expected):
    """In this process: the checks end before any rank starts (example_runner)."""
    _assert_usage_error(refuse("wan_block.py", *argv), *expected)
