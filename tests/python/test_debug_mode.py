"""TorchUlyssesGroup on 3 gloo CPU ranks: FAST_ULYSSES_DEBUG=1 refuses a call that differs
across ranks, or is invalid on one rank, on every rank and naming both calls; results that are
never used leave no unwaited collective behind (torch warns about one at exit)."""

from __future__ import annotations

from pathlib import Path

import debug_mode as worker
import pytest

WORKER = Path(worker.__file__)
CHECKS = ["debug_head_splits", "debug_mode", "debug_invalid", "debug_agreed", "dropped_results"]
# What torch's ProcessGroup prints at exit for functional-collective results never waited on.
UNWAITED = "unwaited collective"


@pytest.fixture(scope="module")
def three_ranks(launch_ranks):
    return launch_ranks("debug_mode", 3, timeout=180)


@pytest.mark.parametrize("check", CHECKS)
def test_check_passes_on_every_rank(three_ranks, check):
    three_ranks.assert_check(check)


def test_every_check_ran():
    """CHECKS names every check the worker runs (so none is silently left untested)."""
    text = WORKER.read_text()
    assert all(f'report.check("{c}")' in text for c in CHECKS)
    assert text.count("report.check(") == len(CHECKS)


def test_dropped_results_leave_no_unwaited_collective(three_ranks):
    three_ranks.assert_clean_exit()
    for run in three_ranks.ranks:
        assert UNWAITED not in run.output, f"rank {run.rank} warned:\n{run.output}"
