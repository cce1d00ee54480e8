"""`fast-ulysses doctor`: runs and exits 0 here; on a GPU-less machine it says so plainly."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from fast_ulysses import topology_probe
from fast_ulysses.cli import doctor

NO_GPU = topology_probe.visible_gpu_count() == 0
needs_no_gpu = pytest.mark.skipif(not NO_GPU, reason="checks the report of a machine with no GPU")
needs_gpu = pytest.mark.skipif(NO_GPU, reason="needs a visible CUDA GPU")


def _doctor(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fast_ulysses.cli.doctor", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_doctor_table_exits_0():
    done = _doctor("--no-symm-init")
    assert done.returncode == 0, done.stderr
    assert "make_group verdict" in done.stdout


@pytest.mark.parametrize(
    "name,value,rule",
    [
        ("FAST_ULYSSES_ALLOW_SHARED_GPU", "yes", "must be 0 (off) or 1 ("),
        # The others in the full tier: a process each, and one parser (csrc/env) for all.
        *(
            pytest.param(*case, marks=pytest.mark.full)
            for case in (
                ("FAST_ULYSSES_DEBUG", "yes", "must be 0 (off) or 1 ("),
                ("FAST_ULYSSES_EAGER_GRAPHS", "on", "must be 0 (call by call) or 1 ("),
                ("FAST_ULYSSES_HOST_PROFILE", "true", "must be 0 (off) or 1 (time each stage"),
                ("FAST_ULYSSES_WATCHDOG_S", "-1", "must be a number of seconds >= 0"),
                ("FAST_ULYSSES_WATCHDOG_ACTION", "kill", "must be 'report' or 'abort'"),
            )
        ),
    ],
)
def test_doctor_refuses_a_bad_setting_without_a_traceback(name, value, rule, monkeypatch):
    """Every FAST_ULYSSES_* setting, the transport's included (one parser, csrc/env): a bad
    value is a usage error before the report, which would depend on it."""
    monkeypatch.setenv(name, value)
    done = _doctor("--no-symm-init")
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    want = f"fast-ulysses doctor: error: {name}={value}: {rule}"
    assert done.stderr.strip().startswith(want) and "\n" not in done.stderr.strip(), done.stderr
    assert done.stdout == ""


@needs_no_gpu
def test_doctor_says_no_gpu():
    done = _doctor()
    assert done.returncode == 0, done.stderr
    assert "no GPU" in done.stdout and "TorchUlyssesGroup" in done.stdout


def test_doctor_json_is_one_object():
    done = _doctor("--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    for key in (
        "versions",
        "gpus",
        "p2p",
        "symmetric_memory",
        "cuda_part",
        "environment",
        "verdict",
    ):
        assert key in report
    assert report["versions"]["torch"]
    if NO_GPU:
        assert report["gpu_available"] is False and report["gpus"] == []
        assert "no GPU" in report["message"]
        assert report["verdict"] == {
            "use_fast": False,
            "reason": "no GPU on rank 0",
            "group": "one CPU rank",
        }


def test_run_through_the_subcommand_parser(capsys, monkeypatch):
    monkeypatch.setenv("FAST_ULYSSES_DEBUG", "1")
    parser = argparse.ArgumentParser(prog="fast-ulysses")
    doctor.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["doctor", "--json", "--no-symm-init"])
    assert args.run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["environment"]["FAST_ULYSSES_DEBUG"] == "1"
    assert "CUDA_VISIBLE_DEVICES" in report["environment"]


@needs_gpu
def test_doctor_lists_every_visible_gpu():
    report = json.loads(_doctor("--json").stdout)
    count = topology_probe.visible_gpu_count()
    assert report["gpu_count"] == count and len(report["gpus"]) == count
    assert len(report["p2p"]) == count * (count - 1) // 2
    assert all(g["pci_bus_id"] for g in report["gpus"])
