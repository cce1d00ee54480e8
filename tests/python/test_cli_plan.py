"""`fast-ulysses plan` on this GPU-free machine."""

from __future__ import annotations

import subprocess
import sys


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "fast_ulysses.cli.main", *args],
                          capture_output=True, text=True, timeout=120)


def test_plan_wan_720p_prints_chunk_bytes():
    result = run_cli("plan", "--preset", "wan-720p", "--world-size", "8")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("12,096,000") >= 8
    assert "96,768,000" in result.stdout


def test_plan_custom_shape_uneven_heads():
    result = run_cli("plan", "--shape", "1,100,12,128", "--world-size", "8",
                     "--head-splits", "2,2,2,2,1,1,1,1", "--rank", "7", "--layout", "sbhd")
    assert result.returncode == 0, result.stderr
    assert "head_splits [2, 2, 2, 2, 1, 1, 1, 1]" in result.stdout


def test_plan_bad_call_is_a_clear_error():
    result = run_cli("plan", "--shape", "1,100,12,128", "--world-size", "8")
    assert result.returncode == 2
    assert "pass head_splits" in result.stderr
    assert "Traceback" not in result.stderr
