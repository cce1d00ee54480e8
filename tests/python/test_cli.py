"""The `fast-ulysses` command as a whole: --version, `python -m fast_ulysses`, --help."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

import fast_ulysses

WIDE = {**os.environ, "COLUMNS": "200"}  # help lines unwrapped, so a default reads on one line


def run(*argv, module="fast_ulysses"):
    return subprocess.run(
        [sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120, env=WIDE
    )


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
    result = run("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: fast-ulysses ")
    for text in ("--version", "plan", "doctor", "bench"):
        assert text in result.stdout


def test_plan_help_shows_defaults():
    result = run("plan", "--help")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()

    def option(name):
        return next(line for line in lines if line.lstrip().startswith(name))

    assert option("--rank").endswith("(default: 0)")
    assert option("--mode").endswith("(default: 0)")
    assert option("--layout").endswith("(default: bshd)")
    assert "(default: None)" not in result.stdout and "(default: False)" not in result.stdout


def test_doctor_help():
    result = run("doctor", "--help")
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
            f"fast-ulysses bench: error: argument --nproc: '{2**63}' is beyond int64",
        ),
        (
            ("plan", "--preset", "wan-720p", "--world-size", str(2**64)),
            f"fast-ulysses plan: error: argument --world-size: '{2**64}' is beyond int64",
        ),
    ],
)
def test_a_bad_integer_is_one_usage_line_on_any_machine(argv, message):
    """The installed command's way in: exit 2, the last stderr line names the option, no
    traceback; bench says so before it looks for a GPU."""
    result = run(*argv)
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(message), result.stderr
    assert "no CUDA GPU" not in result.stderr
