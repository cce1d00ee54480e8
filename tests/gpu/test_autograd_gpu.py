"""Autograd, UlyssesAttention and the framework adapters on the fast group: the CPU tests'
workers (tests/workers/autograd.py, attention.py, integrations.py) run with --shared-gpu, P = 1,
2, 3 ranks sharing this machine's first GPU (UlyssesGroup over gloo), one launch per worker and P
(each on its whole world), one test per check. Plus torch.compile of a backward through the op,
in process. They skip, saying why, where no GPU is visible."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import attention
import autograd
import integrations
import pytest
import torch
from _gpu import needs_gpu

NPROCS = (1, 2, 3)  # one launch per P: the fast group runs each worker on its whole world only
TIMEOUT_S = 480
WORKERS = {"autograd": autograd, "attention": attention, "integrations": integrations}


def cases():
    return [
        (name, n, check)
        for name, module in WORKERS.items()
        for n in NPROCS
        for check in module.check_names(n, shared_gpu=True)
    ]


@needs_gpu
@pytest.mark.parametrize("worker,nproc,check", cases())
def test_fast_group_check(launch_ranks, worker, nproc, check):
    launch_ranks(worker, nproc, timeout=TIMEOUT_S, shared_gpu=True).assert_check(check)


@needs_gpu
@pytest.mark.parametrize("worker,nproc", [(w, n) for w in sorted(WORKERS) for n in NPROCS])
def test_fast_group_run_ends_cleanly(launch_ranks, worker, nproc):
    launch_ranks(worker, nproc, timeout=TIMEOUT_S, shared_gpu=True).assert_clean_exit()


@needs_gpu
def test_compile_traces_the_backward():
    """torch.compile (aot_eager) traces the op's registered backward: x.grad of a compiled
    round trip through mode 0 and mode 1 equals the eager one (P = 1, in process)."""
    import torch.distributed as dist

    import fast_ulysses as fu

    store = tempfile.NamedTemporaryFile(delete=False)
    dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
    try:
        group = fu.UlyssesGroup(dist.group.WORLD, 1 << 20)

        def step(t):
            return group.all_to_all_single_4d(group.all_to_all_single_4d(t, 0, "c0"), 1, "c1")

        x = torch.randn(2, 16, 4, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        w = torch.randn_like(x)
        compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
        (compiled(x) * w).sum().backward()
        assert torch.equal(x.grad, w)
        group.destroy()
    finally:
        dist.destroy_process_group()


@needs_gpu
def test_wan_block_on_a_shared_gpu():
    """examples/wan_block.py with 8 ranks sharing the first GPU: 12 heads on 8 ranks, a 1001-token
    sequence, forward, gradients and 3 SGD steps within bfloat16 tolerance of one rank."""
    import os
    import subprocess

    from multirank import SHARED_GPU_ENV

    example = Path(__file__).resolve().parents[2] / "examples" / "wan_block.py"
    result = subprocess.run(
        [sys.executable, str(example), "--shared-gpu", "--nproc", "8"],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        env=dict(os.environ, **SHARED_GPU_ENV),
    )
    out = result.stdout + result.stderr
    print(out)
    assert result.returncode == 0, out
    assert "8 ranks on one shared GPU (gloo), bfloat16, fast path (UlyssesGroup)" in out, out
    assert "head_splits [2, 2, 2, 2, 1, 1, 1, 1]" in out and ": True" in out, out


@needs_gpu
def test_compile_ulysses_attention():
    """UlyssesAttention under torch.compile (aot_eager, fullgraph), with and without grad: the
    same output and gradient as eager (P = 1, in process)."""
    import torch.distributed as dist

    import fast_ulysses as fu

    store = tempfile.NamedTemporaryFile(delete=False)
    dist.init_process_group("gloo", init_method=f"file://{store.name}", rank=0, world_size=1)
    try:
        group = fu.UlyssesGroup(dist.group.WORLD, 1 << 20)
        attn = fu.UlyssesAttention(group)
        compiled = torch.compile(attn, backend="aot_eager", fullgraph=True)
        q = torch.randn(1, 64, 4, 64, dtype=torch.bfloat16, device="cuda", requires_grad=True)
        want = attn(q, q, q)
        want.sum().backward()
        want_grad, q.grad = q.grad, None
        got = compiled(q, q, q)
        got.sum().backward()
        assert torch.equal(got, want) and torch.equal(q.grad, want_grad)
        with torch.no_grad():
            assert torch.equal(compiled(q, q, q), attn(q, q, q))
        group.destroy()
    finally:
        dist.destroy_process_group()
