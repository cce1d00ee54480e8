"""The multi-rank launcher (tests/workers/multirank.py, through the launch_ranks fixture of
tests/conftest.py) on CPU ranks: the path every multi-rank test, CPU or GPU, launches its workers
through, exercised here with a tiny gloo worker (tests/workers/launcher_probe.py) that passes,
fails a named check, or hangs."""

from __future__ import annotations

import json

import pytest
from multirank import REPORT_ENV, Report, worker_path

WORKER = "launcher_probe"


def test_passing_workers_report_every_check(launch_ranks):
    run = launch_ranks(WORKER, 3, timeout=120)
    run.assert_clean_exit()
    for check in ("sum_of_ranks", "barrier"):
        run.assert_check(check)
    assert [r.report["checks"][0]["detail"] for r in run.ranks] == ["3 ranks"] * 3
    assert run.check_names() == ["sum_of_ranks", "barrier"]


def test_a_failing_check_reaches_pytest_by_name(launch_ranks):
    run = launch_ranks(WORKER, 2, "--fail", "barrier", timeout=120)
    run.assert_check("sum_of_ranks")  # the check before it passed on both ranks
    with pytest.raises(
        AssertionError,
        match=r"^check barrier failed on rank 1: "
        r"AssertionError: rank 1 was told to fail",
    ):
        run.assert_check("barrier")
    assert run.ranks[1].returncode == 1
    with pytest.raises(AssertionError, match="rank 1: exit 1"):
        run.assert_clean_exit()


def test_a_check_that_never_ran_is_named(launch_ranks):
    run = launch_ranks(WORKER, 2, "--fail", "sum_of_ranks", timeout=120)
    failure = run.check_failure("barrier", ranks=[1])
    assert failure.startswith(
        "check barrier it never ran on rank 1 (exit 1; checks it reached: ['sum_of_ranks'])"
    ), failure


def test_a_hang_is_killed_at_the_timeout(launch_ranks):
    run = launch_ranks(WORKER, 2, "--sleep", "600", timeout=3)
    assert run.timed_out
    assert [r.returncode for r in run.ranks] == [None, None]
    assert run.check_failure("sum_of_ranks") == (
        "check sum_of_ranks rank 0 wrote no report (killed by the launcher); "
        "rank 1 wrote no report (killed by the launcher)"
    )


def test_one_launch_per_worker_ranks_and_arguments(launch_ranks):
    """The fixture launches a (worker, nproc, args, env) once and hands the same run to every
    test that asks for it; other arguments are another launch."""
    first = launch_ranks(WORKER, 3, timeout=120)
    assert launch_ranks(WORKER, 3, timeout=120) is first
    assert launch_ranks(WORKER, 2, "--fail", "barrier", timeout=120) is not first
    assert first.script == worker_path(WORKER) and first.script.parent.name == "workers"


def test_an_unknown_worker_is_named():
    with pytest.raises(FileNotFoundError, match="no worker 'nonexistent' in .*workers"):
        worker_path("nonexistent")


def test_report_writes_nothing_outside_the_launcher(tmp_path, monkeypatch):
    monkeypatch.delenv(REPORT_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    report = Report(0)
    with report.check("alone"):
        pass
    assert report.path is None and list(tmp_path.iterdir()) == []


def test_report_records_a_failure_and_reraises(tmp_path, monkeypatch):
    monkeypatch.setenv(REPORT_ENV, str(tmp_path))
    report = Report(4)
    with pytest.raises(ValueError, match="bad value"):
        with report.check("values"):
            raise ValueError("bad value")
    data = json.loads((tmp_path / "rank4.json").read_text())
    assert data == {
        "rank": 4,
        "finished": False,
        "checks": [{"name": "values", "status": "failed", "detail": "ValueError: bad value"}],
    }
