"""GPU tests of CUDA-graph capture (issue 9, item 2): P = 1..8 ranks sharing this machine's first
GPU over gloo (FAST_ULYSSES_ALLOW_SHARED_GPU=1), each run as the torchrun worker
tests/distributed/graph_correctness.py (every entry point captured and replayed, a captured
attention layer, eager calls between replays, two graphs on one group, the capture-time error,
torch.compile reduce-overhead, the kernel census). They skip, saying why, where no GPU is
visible."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).resolve().parents[1] / "distributed" / "graph_correctness.py"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA GPU visible: the fast path cannot run here")
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}
TIMEOUT_S = 300  # each P should take well under a minute on an H200; this only bounds a hang
TAIL = 8000


def _torchrun(nproc: int, *extra: str, timeout: int = TIMEOUT_S) -> tuple[int, str, str]:
    """Runs the worker; on a timeout kills the whole process group (torchrun and its workers,
    which a plain subprocess timeout would leave holding the GPU) and fails with the output."""
    env = dict(os.environ, **SAFE_ENV, FAST_ULYSSES_ALLOW_SHARED_GPU="1",
               FAST_ULYSSES_WATCHDOG_S="60", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(WORKER), "--shared-gpu", *extra]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"P={nproc}: no result after {timeout} s (killed)\n"
                    f"{(stdout + stderr)[-TAIL:]}")
    return proc.returncode, stdout, stderr


@needs_gpu
@pytest.mark.parametrize("nproc", [1, 2, 3, 4, 5, 8])
def test_graph_capture(nproc):
    rc, stdout, stderr = _torchrun(nproc)
    # stdout first: rank 0's '  ok  <check>' lines, then any 'FAILED [rank r] AssertionError:
    # check <name> ... failed on rank r at replay i: ...' line; stderr holds the tracebacks.
    tail = f"--- stdout ---\n{stdout[-TAIL // 2:]}\n--- stderr ---\n{stderr[-TAIL // 2:]}"
    assert rc == 0, f"P={nproc}: rc {rc}\n{tail}"
    final = re.search(r"^(\d+) passed, 0 failed$", stdout, re.MULTILINE)
    assert final, f"P={nproc}: no 'N passed, 0 failed' line\n{tail}"
    ok_lines = re.findall(r"^  ok  \S+", stdout, re.MULTILINE)
    assert len(ok_lines) == int(final.group(1)) > 0, tail
    print(stdout)
