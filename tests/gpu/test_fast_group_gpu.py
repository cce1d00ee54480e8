"""GPU tests of the fast path: P = 1..8 ranks sharing this machine's first GPU over gloo
(FAST_ULYSSES_ALLOW_SHARED_GPU=1), each run as the torchrun worker
tests/distributed/a2a_correctness.py. They skip, saying why, where no GPU is visible."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).resolve().parents[1] / "distributed" / "a2a_correctness.py"
needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(),
                               reason="no CUDA GPU visible: the fast path cannot run here")
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
            "NVSHMEM_DISABLE_NVLS": "1"}


def _torchrun(nproc: int, *extra: str, timeout: int = 480) -> subprocess.CompletedProcess:
    env = dict(os.environ, **SAFE_ENV, FAST_ULYSSES_ALLOW_SHARED_GPU="1",
               FAST_ULYSSES_WATCHDOG_S="60", PYTHONUNBUFFERED="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc-per-node={nproc}", str(WORKER), "--shared-gpu", *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@needs_gpu
@pytest.mark.parametrize("nproc", [1, 2, 3, 4, 5, 8])
def test_shared_gpu_correctness(nproc):
    result = _torchrun(nproc, "--iterations", "1000")
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-6000:]
    assert " passed, 0 failed" in result.stdout, output[-6000:]
    if nproc > 1:  # check_watchdog made rank 0 wait 5 s for late peers, past a 2 s watchdog
        assert "fast-ulysses watchdog" in output and "has not completed" in output, output[-6000:]
    print(result.stdout)


@needs_gpu
def test_compile_traces_the_op():
    """torch.compile traces the registered op through its Meta kernel (P = 1, in process)."""
    import torch.distributed as dist

    import fast_ulysses as fu

    store_file = tempfile.NamedTemporaryFile(delete=False)
    dist.init_process_group("gloo", init_method=f"file://{store_file.name}", rank=0,
                            world_size=1)
    try:
        group = fu.UlyssesGroup(dist.group.WORLD, 1 << 20)
        x = torch.randn(2, 16, 4, 64, dtype=torch.bfloat16, device="cuda")

        def step(t):
            return group.all_to_all_single_4d(t, 0, "compiled") * 2

        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        got = compiled(x)
        want = fu.simulate([x.cpu()], 0)[0] * 2
        assert torch.equal(got.cpu(), want)
        group.destroy()
    finally:
        dist.destroy_process_group()


@needs_gpu
def test_watchdog_abort_ends_a_hung_job():
    """A rank that never calls: with FAST_ULYSSES_WATCHDOG_ACTION=abort (the default) its peer's
    watchdog reports on stderr and ends the process, so torchrun exits non-zero within the
    watchdog timeout + 10 s instead of hanging."""
    import time

    worker = Path(__file__).resolve().parents[1] / "distributed" / "watchdog_abort.py"
    env = dict(os.environ, **SAFE_ENV, FAST_ULYSSES_ALLOW_SHARED_GPU="1",
               FAST_ULYSSES_WATCHDOG_S="3", PYTHONUNBUFFERED="1")
    env.pop("FAST_ULYSSES_WATCHDOG_ACTION", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(worker)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    ended = time.time()
    output = result.stdout + result.stderr
    assert result.returncode != 0, f"the hung job exited 0:\n{output[-4000:]}"
    assert "has not completed after" in result.stderr, output[-4000:]
    assert "ending this process" in result.stderr, output[-4000:]
    issued = re.search(r"rank 0: issuing at ([0-9.]+)", result.stdout)
    assert issued, output[-4000:]
    elapsed = ended - float(issued.group(1))
    assert elapsed < 3 + 10, f"the job ended {elapsed:.1f} s after the call, past timeout + 10 s"
