"""Runs an example's argument checks in this process (a helper of the example tests, not a test).

Every example parses and checks its arguments before it starts a rank (examples/_launch.py), so
a refused argument never gets past `main`: running the script in this process with runpy costs
nothing, where a subprocess per case paid torch's import again. Call it only with arguments the
example refuses, or with --help: valid arguments would start ranks from the test process."""

from __future__ import annotations

import contextlib
import io
import runpy
import subprocess
import sys
from pathlib import Path
from unittest import mock

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def refuse(name: str, *argv: str) -> subprocess.CompletedProcess:
    """`python examples/<name> *argv` in this process, up to its argparse exit: the exit code,
    stdout and stderr as a CompletedProcess. Raises AssertionError if the example got past its
    argument checks (returned or raised anything but SystemExit)."""
    script = EXAMPLES / name
    out, err = io.StringIO(), io.StringIO()
    with (
        mock.patch.object(sys, "argv", [str(script), *argv]),
        mock.patch.object(sys, "path", [str(EXAMPLES), *sys.path]),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            runpy.run_path(str(script), run_name="__main__")
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
        else:
            raise AssertionError(f"{name} {' '.join(argv)} got past its argument checks")
        finally:
            sys.modules.pop("_launch", None)  # examples/ leaves sys.path: so does its helper
    return subprocess.CompletedProcess([name, *argv], code, out.getvalue(), err.getvalue())
