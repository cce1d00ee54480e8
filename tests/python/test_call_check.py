"""TorchUlyssesGroup's call check and out= on 3 gloo CPU ranks (subgroups of P = 1, 2, 3): ranks
that disagree about a call (uneven rows without seq_splits, head_splits on one rank only, another
mode, tag, layout, dtype, barrier or entry point), or of which only some refuse their own call,
raise FastUlyssesError on every rank before anything is sent, and the group works afterwards;
FAST_ULYSSES_CHECK_CALLS turns the check off and must agree across ranks; out= is bit-exact and
refuses a bad out on every rank. What each check does: tests/workers/call_check.py's docstring."""

from __future__ import annotations

import call_check as _worker
import pytest

WORLD = 3
PER_P = [
    (name, P)
    for P in (2, 3)
    for name in _worker.MISMATCH_CHECKS + _worker.SWITCH_CHECKS + _worker.OUT_CHECKS
]
PER_P += [(name, 1) for name in _worker.OUT_CHECKS]


@pytest.fixture(scope="module")
def three_ranks(launch_ranks):
    return launch_ranks(
        "call_check",
        WORLD,
        timeout=300,
        env={
            "CUDA_VISIBLE_DEVICES": "",
            "FAST_ULYSSES_CHECK_CALLS": None,
            "FAST_ULYSSES_DEBUG": None,
        },
    )


@pytest.mark.parametrize("name,P", PER_P, ids=[f"{n}-P{P}" for n, P in PER_P])
def test_check_passes_on_every_rank(three_ranks, name, P):
    three_ranks.assert_check(f"{name}_P{P}", ranks=range(WORLD - P, WORLD))


def test_all_ranks_exit_cleanly(three_ranks):
    three_ranks.assert_clean_exit()


def test_every_check_is_listed():
    """Every check function of the worker is in one of its lists (none silently skipped)."""
    listed = _worker.MISMATCH_CHECKS + _worker.SWITCH_CHECKS + _worker.OUT_CHECKS
    assert sorted(listed) == sorted(_worker.CHECKS) and len(set(listed)) == len(listed)
    assert all(f"  {name}" in _worker.__doc__ for name in listed)
