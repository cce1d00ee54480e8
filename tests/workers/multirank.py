"""The one launcher of every multi-rank test, and the per-rank report its workers write.

Every multi-rank worker lives in this folder (tests/workers), beside the helper modules it
imports; tests/conftest.py puts the folder on sys.path and wraps `launch` in the one fixture
every test launches through (`launch_ranks`), on gloo CPU ranks or on ranks sharing one GPU.

Parent side (pytest): `launch(script, nproc, tmp, timeout=...)` starts `nproc` processes of
`script` (a path, or a worker's name in this folder) with torchrun's environment (RANK,
WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT; with nodes=N,
that of N nodes of consecutive ranks on this machine), so a worker calls
`dist.init_process_group(backend)` exactly as under torchrun and stays runnable with torchrun
on a real node. gloo is pinned to the loopback interface. The first rank to fail gets the others
killed (they would only wait for it in a collective), and so does the timeout: a hang fails the
test instead of stalling it. Each rank's stdout and stderr go to <tmp>/rank<r>.log.
`SHARED_GPU_ENV` is what a launch of ranks sharing the first GPU adds to the environment.

Worker side: `Report(rank)` writes <dir>/rank<r>.json when the launcher set REPORT_ENV to <dir>
(under plain torchrun it writes nothing). `with report.check(name):` records the check as
running, then passed or failed with the error, rewriting the file at each step, so a rank that
crashes or is killed mid-check still says which check it was in. `Launch.assert_check(name)`
turns that into a pytest assertion that names the check, the rank and the error.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPORT_ENV = "FAST_ULYSSES_TEST_REPORT"
TAIL_LINES = 40
WORKERS = Path(__file__).resolve().parent
# Ranks sharing the first GPU over gloo; multicast stays off in every GPU run.
SHARED_GPU_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
    "FAST_ULYSSES_ALLOW_SHARED_GPU": "1",
    "FAST_ULYSSES_WATCHDOG_S": "60",
}


def worker_path(worker: str | Path) -> Path:
    """The worker script `worker` names: a path, or the name of a worker in this folder."""
    if isinstance(worker, Path):
        return worker
    path = WORKERS / f"{worker}.py"
    if not path.is_file():
        raise FileNotFoundError(f"no worker {worker!r} in {WORKERS}")
    return path


def subgroup_sizes(world: int, fast: bool) -> list[int]:
    """The group sizes P a worker runs, each on the last P ranks of its world: 1..world, or with
    the fast group only the whole world. torch's symmetric-memory rendezvous counts allocations
    per process, not per group, so ranks whose processes allocated on different earlier groups
    wait for each other's keys until the store times out (docs/API.md, "Process groups")."""
    return [world] if fast else list(range(1, world + 1))


def run_framework_checks(report, pg, P: int, checks: dict, frameworks, device) -> None:
    """Each framework's checks (`checks[framework]`: (name, fn(pg, P, device)) pairs) as
    `<name>_P<P>`."""
    for framework in frameworks:
        for name, fn in checks[framework]:
            with report.check(f"{name}_P{P}"):
                fn(pg, P, device)


def framework_check_names(checks: dict, world: int, fast: bool = False) -> list[tuple[str, str]]:
    """(framework, check name) of every check `run_framework_checks` runs at every P of
    `subgroup_sizes(world, fast)`."""
    return [
        (framework, f"{name}_P{P}")
        for P in subgroup_sizes(world, fast)
        for framework, framework_checks in checks.items()
        for name, _ in framework_checks
    ]


FAST_GROUP_CHECK = "fast_group"


def check_fast_group(report, pg, P: int) -> None:
    """Check `fast_group_P<P>` of a worker whose ranks share a GPU: the registry's group for
    `pg` is the fast one (not the fallback), so the checks after it test the fast path."""
    from fast_ulysses.attention import group_for

    with report.check(f"{FAST_GROUP_CHECK}_P{P}"):
        group = group_for(pg)
        assert not group.fallback, f"the fallback group was chosen: {group.fallback_reason}"


def parse_framework_args(checks: dict, argv=None) -> tuple[argparse.Namespace, list[str]]:
    """A framework worker's arguments: --frameworks (comma-separated keys of `checks`, default
    all) and --shared-gpu. Returns the arguments and the frameworks named; exits through
    argparse naming an unknown one."""
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--frameworks",
        default=",".join(checks),
        help=f"comma-separated, of {', '.join(checks)} (default: all)",
    )
    parser.add_argument(
        "--shared-gpu",
        action="store_true",
        help="every rank on cuda:0, ours on the fast group (FAST_ULYSSES_ALLOW_SHARED_GPU=1)",
    )
    args = parser.parse_args(argv)
    frameworks = [f for f in args.frameworks.split(",") if f]
    unknown = [f for f in frameworks if f not in checks]
    if unknown:
        parser.error(f"--frameworks: unknown {unknown}; known: {', '.join(checks)}")
    return args, frameworks


def parse_shared_gpu_only(doc: str, argv=None):
    """Arguments of a GPU worker that has no options: `--shared-gpu` accepted, for a launch
    like every GPU worker's, since it always runs its ranks on cuda:0 over gloo."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument(
        "--shared-gpu",
        action="store_true",
        help="accepted for a launch like every GPU worker's: this worker always "
        "runs its ranks on cuda:0 over gloo (FAST_ULYSSES_ALLOW_SHARED_GPU=1)",
    )
    return parser.parse_args(argv)


def run_on_subgroups(fast: bool, body, *, timeout_s: float = 120) -> int:
    """A worker's main: joins the gloo world torchrun (or `launch`) describes, then for each P of
    `subgroup_sizes` builds the group of the last P ranks (collective: every rank) and calls
    `body(report, pg, P, device)` on its members; device is cuda:0 when `fast` (ranks sharing
    the first GPU), else the CPU. Returns the exit code: 1 after printing the first exception
    (the report says which check it was in), else 0."""
    import datetime
    import traceback

    import torch
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group("gloo", timeout=timeout)
    if fast:
        torch.cuda.set_device(0)
    device = torch.device("cuda", 0) if fast else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    report = Report(rank)
    try:
        for P in subgroup_sizes(world, fast):
            members = list(range(world - P, world))
            pg = dist.new_group(members, timeout=timeout)
            if rank in members:
                body(report, pg, P, device)
            dist.barrier()
    except Exception:  # noqa: BLE001 - report everything, then fail this rank
        traceback.print_exc()
        sys.stdout.flush()
        return 1
    report.finish()
    dist.destroy_process_group()
    return 0


# -- worker side ------------------------------------------------------------------------------


class Report:
    """This rank's checks, as a JSON file: {"rank", "checks": [{"name", "status", "detail"}],
    "finished"}; status is "running", "passed" or "failed"."""

    def __init__(self, rank: int):
        directory = os.environ.get(REPORT_ENV)
        self.path = Path(directory) / f"rank{rank}.json" if directory else None
        self.data = {"rank": rank, "checks": [], "finished": False}
        self._write()

    @contextlib.contextmanager
    def check(self, name: str):
        """Records check `name` around the block; yields its entry (set entry["detail"] to a
        summary). An exception marks it failed with the error's text and propagates."""
        entry = {"name": name, "status": "running", "detail": ""}
        self.data["checks"].append(entry)
        self._write()
        try:
            yield entry
        except BaseException as error:
            entry["status"] = "failed"
            entry["detail"] = f"{type(error).__name__}: {error}"
            self._write()
            raise
        entry["status"] = "passed"
        self._write()

    def finish(self) -> None:
        """Every check ran: the worker is about to exit 0."""
        self.data["finished"] = True
        self._write()

    def _write(self) -> None:
        if self.path is None:
            return
        partial = self.path.with_suffix(".json.partial")
        partial.write_text(json.dumps(self.data, indent=1))
        os.replace(partial, self.path)  # readers never see half a file


# -- parent side ------------------------------------------------------------------------------


@dataclass
class RankRun:
    rank: int
    returncode: int | None  # None: still running when the launcher killed it
    output: str  # stdout and stderr, interleaved
    report: dict | None  # the rank's JSON report; None if it wrote none

    def status(self) -> str:
        return "killed by the launcher" if self.returncode is None else f"exit {self.returncode}"

    def entry(self, name: str) -> dict | None:
        checks = (self.report or {}).get("checks", [])
        return next((c for c in checks if c["name"] == name), None)


@dataclass
class Launch:
    script: Path
    ranks: list[RankRun]
    timed_out: bool

    def describe(self) -> str:
        """Every rank's exit and last lines, for an assertion message."""
        head = f"{self.script.name}, {len(self.ranks)} ranks" + (
            " (timed out)" if self.timed_out else ""
        )
        parts = [head]
        for r in self.ranks:
            tail = "\n".join(r.output.strip().splitlines()[-TAIL_LINES:])
            parts.append(f"--- rank {r.rank}: {r.status()}\n{tail}")
        return "\n".join(parts)

    def check_failure(self, name: str, ranks=None) -> str | None:
        """Why check `name` did not pass on every rank of `ranks` (default: all), or None. Ranks
        where it failed come first, those that exited on their own before those the launcher
        killed: the others were usually only waiting for them."""
        failed, other = [], []
        for r in self.ranks if ranks is None else [self.ranks[i] for i in ranks]:
            entry = r.entry(name)
            if r.report is None:
                other.append(f"rank {r.rank} wrote no report ({r.status()})")
            elif entry is None:
                done = [c["name"] for c in r.report["checks"]]
                other.append(
                    f"it never ran on rank {r.rank} ({r.status()}; checks it reached: {done})"
                )
            elif entry["status"] == "failed":  # a rank that failed on its own goes first
                failed.insert(
                    len(failed) if r.returncode is None else 0,
                    f"failed on rank {r.rank}: {entry['detail']}",
                )
            elif entry["status"] != "passed":
                other.append(f"it did not finish on rank {r.rank} ({r.status()})")
        problems = failed + other
        return f"check {name} " + "; ".join(problems) if problems else None

    def assert_check(self, name: str, ranks=None) -> None:
        failure = self.check_failure(name, ranks)
        assert failure is None, f"{failure}\n{self.describe()}"

    def assert_clean_exit(self) -> None:
        """Every rank exited 0 and reported that it finished every check."""
        for r in self.ranks:
            assert r.returncode == 0, f"rank {r.rank}: {r.status()}\n{self.describe()}"
            assert r.report is not None and r.report["finished"], (
                f"rank {r.rank} exited 0 without finishing its report\n{self.describe()}"
            )

    def check_names(self, rank: int = 0) -> list[str]:
        return [c["name"] for c in (self.ranks[rank].report or {}).get("checks", [])]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(
    script: str | Path,
    nproc: int,
    tmp: Path,
    *,
    timeout: float,
    args=(),
    env: dict | None = None,
    nodes: int = 1,
) -> Launch:
    """Runs `script` as `nproc` ranks and waits for all of them, a failure or the timeout.
    `env` adds to this process's environment; a None value removes the variable. `nodes` > 1
    splits the ranks into that many simulated nodes of consecutive ranks, as `torchrun --nnodes`
    numbers them: each rank gets its node's torchrun environment (`node_env`)."""
    script = worker_path(script)
    if nodes < 1 or nproc % nodes:
        raise ValueError(f"nodes={nodes}: it must be >= 1 and divide nproc={nproc}")
    tmp.mkdir(parents=True, exist_ok=True)
    reports = tmp / "reports"
    reports.mkdir(exist_ok=True)
    base = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        WORLD_SIZE=str(nproc),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        **{REPORT_ENV: str(reports)},
        **(env or {}),
    )
    base = {name: value for name, value in base.items() if value is not None}
    logs = [open(tmp / f"rank{r}.log", "w+") for r in range(nproc)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=logs[r],
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(base, RANK=str(r), **node_env(r, nproc, nodes)),
        )
        for r in range(nproc)
    ]
    killed = set()
    try:
        timed_out = not _wait(procs, timeout)
    finally:
        for r, p in enumerate(procs):
            if p.poll() is None:
                killed.add(r)
            with contextlib.suppress(ProcessLookupError):  # the rank and all it started
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    ranks = []
    for r, (p, log) in enumerate(zip(procs, logs)):
        log.seek(0)
        path = reports / f"rank{r}.json"
        report = json.loads(path.read_text()) if path.exists() else None
        ranks.append(RankRun(r, None if r in killed else p.returncode, log.read(), report))
        log.close()
    return Launch(script, ranks, timed_out)


def node_env(rank: int, nproc: int, nodes: int = 1) -> dict:
    """torchrun's per-node environment of world rank `rank` when `nproc` ranks run as `nodes`
    nodes of consecutive ranks: GROUP_RANK (the node rank; fast_ulysses counts it in a rank's
    node, so nodes on one machine are told apart), NODE_RANK, GROUP_WORLD_SIZE, LOCAL_RANK and
    LOCAL_WORLD_SIZE."""
    per_node = nproc // nodes
    node = str(rank // per_node)
    return dict(
        GROUP_RANK=node,
        NODE_RANK=node,
        GROUP_WORLD_SIZE=str(nodes),
        LOCAL_RANK=str(rank % per_node),
        LOCAL_WORLD_SIZE=str(per_node),
    )


def _wait(procs, timeout: float) -> bool:
    """True once every rank exited 0 or one failed; False at the timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes) or all(c == 0 for c in codes):
            return True
        time.sleep(0.05)
    return False
