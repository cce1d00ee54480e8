"""Runs one Python script as `world_size` ranks in subprocesses, with a hard timeout.

Each rank gets --rank, --world-size and --init (a FileStore URL on a fresh file) and gloo is
pinned to the loopback interface, so nothing leaves the machine. The first rank to fail gets the
others killed (they would only wait for it in a collective), and so does the timeout: a hang
fails the test instead of stalling it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class RankResult:
    rank: int
    returncode: int | None  # None: killed (timeout or another rank failed)
    output: str


def run_ranks(script: Path, world_size: int, tmp: Path, *, timeout: float,
              extra_args: tuple[str, ...] = ()) -> list[RankResult]:
    """Starts the ranks, waits for all of them (or the timeout) and returns what each did."""
    init = f"file://{tmp / 'store'}"
    env = dict(os.environ, GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    logs = [open(tmp / f"rank{r}.log", "w+") for r in range(world_size)]
    procs = [subprocess.Popen(
        [sys.executable, str(script), "--rank", str(r), "--world-size", str(world_size),
         "--init", init, *extra_args], stdout=logs[r], stderr=subprocess.STDOUT, env=env)
        for r in range(world_size)]
    try:
        _wait(procs, timeout)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for r, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        killed = p.returncode is not None and p.returncode < 0
        results.append(RankResult(r, None if killed else p.returncode, log.read()))
        log.close()
    return results


def _wait(procs, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
            return
        time.sleep(0.05)


def describe(results: list[RankResult]) -> str:
    """Every rank's exit and last lines, for an assertion message."""
    parts = []
    for r in results:
        status = "killed" if r.returncode is None else f"exit {r.returncode}"
        tail = "\n".join(r.output.strip().splitlines()[-25:])
        parts.append(f"--- rank {r.rank}: {status}\n{tail}")
    return "\n".join(parts)
