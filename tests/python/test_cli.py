"""The `fast-ulysses` command as a whole: --version, `python -m fast_ulysses`, --help."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
from unittest import mock

import pytest

import fast_ulysses
from fast_ulysses.cli.main import main
from fast_ulysses.topology import MAX_RANKS

WIDE = {**os.environ, "COLUMNS": "200"}  # help lines unwrapped, so a default reads on one line


def run(*argv, module="fast_ulysses"):
    """The command as its own process (python -m module): for what is about the way in."""
    return subprocess.run(
        [sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120, env=WIDE
    )


def run_here(*argv) -> subprocess.CompletedProcess:
    """The command's main in this process, as wide as `run` (COLUMNS=200), stdout and stderr
    captured and an argparse exit taken as the exit code: a process per test would only pay
    torch's import again."""
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.dict(os.environ, {"COLUMNS": "200"}),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = main(list(argv))
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
    return subprocess.CompletedProcess(argv, code, out.getvalue(), err.getvalue())


@pytest.mark.parametrize("module", ["fast_ulysses", "fast_ulysses.cli.main"])
def test_version(module):
    result = run("--version", module=module)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"fast-ulysses {fast_ulysses.__version__}\n"


@pytest.mark.skipif(shutil.which("fast-ulysses") is None, reason="entry point not installed")
def test_version_of_the_installed_command():
    result = subprocess.run(
        ["fast-ulysses", "--version"], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"fast-ulysses {fast_ulysses.__version__}\n"


def test_python_m_fast_ulysses_is_the_command():
    argv = ("plan", "--preset", "wan-1.3b-720p", "--world-size", "8", "--rank", "7", "--json")
    via_package = run(*argv)
    via_main = run(*argv, module="fast_ulysses.cli.main")
    assert via_package.returncode == 0, via_package.stderr
    assert via_package.stdout == via_main.stdout and '"window_bytes"' in via_package.stdout


def test_python_m_fast_ulysses_without_a_command():
    result = run()
    assert result.returncode == 2
    assert result.stderr.startswith("usage: fast-ulysses ")
    assert "the following arguments are required: command" in result.stderr


def test_top_level_help():
    result = run_here("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: fast-ulysses ")
    for text in ("--version", "plan", "doctor", "bench"):
        assert text in result.stdout


def test_plan_help_shows_defaults():
    result = run_here("plan", "--help")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()

    def option(name):
        return next(line for line in lines if line.lstrip().startswith(name))

    assert option("--rank").endswith("(default: 0)")
    assert option("--mode").endswith("(default: 0)")
    assert option("--layout").endswith("(default: bshd)")
    assert "(default: None)" not in result.stdout and "(default: False)" not in result.stdout


def test_doctor_help():
    result = run_here("doctor", "--help")
    assert result.returncode == 0, result.stderr
    assert "--json" in result.stdout and "--no-symm-init" in result.stdout
    assert "(default: False)" not in result.stdout


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ("bench", "--shape", "a,b"),
            "fast-ulysses bench: error: argument --shape: 'a,b': 'a' is not an integer",
        ),
        (
            ("bench", "--nproc", str(2**63)),
            f"fast-ulysses bench: error: argument --nproc: '{2**63}' is out of range: it must "
            f"be in [1, {MAX_RANKS}]",
        ),
        (
            ("plan", "--preset", "wan-720p", "--world-size", str(2**64)),
            f"fast-ulysses plan: error: argument --world-size: '{2**64}' is out of range: it "
            f"must be in [1, {MAX_RANKS}] (e.g. 8)",
        ),
        (
            ("plan", "--preset", "wan-720p", "--world-size", "8", "--seq-splits", "4,x"),
            "fast-ulysses plan: error: argument --seq-splits: '4,x': 'x' is not an integer "
            "(give comma-separated integers, e.g. 4,3,3 for 3 ranks)",
        ),
    ],
)
def test_a_bad_integer_is_one_usage_line_on_any_machine(argv, message):
    """The installed command's way in: exit 2, the last stderr line names the option, no
    traceback; bench says so before it looks for a GPU."""
    result = run_here(*argv)
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr
    assert "no CUDA GPU" not in result.stderr


@pytest.mark.parametrize(
    "command,usage",
    [
        ("doctor", "usage: fast-ulysses doctor [-h] [--json] [--no-symm-init]"),
        ("bench", "usage: fast-ulysses bench "),
    ],
)
def test_an_unknown_option_of_a_command_shows_that_commands_usage(command, usage):
    """`fast-ulysses doctor --bogus`: doctor's usage and `fast-ulysses doctor: error:`, not the
    top-level usage (which lists no option of doctor)."""
    result = run_here(command, "--bogus")
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(usage), result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"fast-ulysses {command}: error: unrecognized arguments: --bogus"
    )


def test_an_unknown_option_of_plan_shows_plans_usage():
    result = run_here("plan", "--preset", "wan-720p", "--world-size", "8", "--bogus", "x")
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("usage: fast-ulysses plan "), result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "fast-ulysses plan: error: unrecognized arguments: --bogus x"
    )
