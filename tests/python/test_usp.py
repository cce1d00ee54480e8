"""Ulysses x Ring ("USP"): UlyssesAttention(ring_group=...) and fast_ulysses.ring_attention.

Multi-rank: tests/workers/usp.py on gloo CPU ranks, one launch per world size, one test per
check: P = 4 (2 ring x 2 Ulysses) in the fast tier; P = 6 (2 x 3, uneven heads) and P = 8 (4 x 2
and 2 x 4, one launch) are `full` (slow on 2 cores; the P = 4 launch checks every feature).
In process: ring_attention with no ring (R = 1) against SDPA, the block kernels against the
explicit math kernel, argument refusals, and UlyssesAttention's ring choice."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
import usp

import fast_ulysses as fu
from fast_ulysses import ring_kernels as ring

TIMEOUT = 600
LAUNCHES = [
    pytest.param(4, id="P4"),
    pytest.param(6, id="P6", marks=pytest.mark.full),  # full: the P = 4 launch is fast
    pytest.param(8, id="P8", marks=pytest.mark.full),
]


def _checks():
    return [
        pytest.param(p.values[0], check, marks=p.marks, id=f"P{p.values[0]}-{check}")
        for p in LAUNCHES
        for check in usp.check_names(p.values[0])
    ]


@pytest.mark.parametrize("world,check", _checks())
def test_usp_worker_check(launch_ranks, world, check):
    launch_ranks("usp", world, timeout=TIMEOUT).assert_check(check)


@pytest.mark.parametrize("world", LAUNCHES)
def test_usp_ranks_exit_cleanly(launch_ranks, world):
    launch_ranks("usp", world, timeout=TIMEOUT).assert_clean_exit()


def _inputs(hq=4, hkv=2, sq=5, skv=7, d=8, dv=8, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, hq, sq, d, generator=g, dtype=dtype)
    k = torch.randn(2, hkv, skv, d, generator=g, dtype=dtype)
    v = torch.randn(2, hkv, skv, dv, generator=g, dtype=dtype)
    return q, k, v


def _grads(fn, q, k, v, w):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    (out * w).sum().backward()
    return out.detach(), [t.grad for t in (q, k, v)]


@pytest.mark.parametrize("hkv", [4, 2, 1], ids=["mha", "gqa", "mqa"])
def test_ring_attention_without_a_ring_equals_sdpa(hkv):
    """R = 1 (ring_group None): output and q/k/v gradients equal SDPA's (float32)."""
    q, k, v = _inputs(hkv=hkv)
    w = torch.randn(2, 4, 5, 8)
    want = _grads(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), q, k, v, w
    )
    got = _grads(lambda q, k, v: fu.ring_attention(q, k, v, None), q, k, v, w)
    torch.testing.assert_close(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b)


def test_ring_attention_with_a_user_attn_fn_equals_sdpa():
    """R = 1 through a user attn_fn returning (out, lse): its recomputing backward is exact."""
    q, k, v = _inputs(hkv=2, dv=16)
    w = torch.randn(2, 4, 5, 16)
    want = _grads(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), q, k, v, w
    )
    got = _grads(lambda q, k, v: fu.ring_attention(q, k, v, attn_fn=usp.math_attn), q, k, v, w)
    torch.testing.assert_close(got[0], want[0])
    for a, b in zip(got[1], want[1]):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_flash_kernel_matches_the_math_kernel(dtype):
    """The CPU flash block kernel's (out, lse) and its backward given an outside (out, lse)
    equal the explicit math kernel's (the cross-check of the kernel the ring uses on the CPU)."""
    q, k, v = _inputs(hq=3, hkv=3, sq=6, skv=9, dtype=dtype)
    scale = 0.25
    o1, l1 = ring.CpuFlashKernel.forward(q, k, v, scale)
    o2, l2 = ring.MathKernel.forward(q, k, v, scale)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(o1, o2, **tol)
    torch.testing.assert_close(l1.float(), l2, **tol)
    # Backward of one block with a global (out, lse) from a larger attention: block 1 of 2.
    k2, v2 = (torch.cat([t, t.flip(2)], dim=2) for t in (k, v))
    out, lse = ring.MathKernel.forward(q, k2, v2, scale)
    dout = torch.randn_like(out)
    g1 = ring.CpuFlashKernel.backward(dout, q, k, v, out, lse, scale)
    g2 = ring.MathKernel.backward(dout, q, k, v, out, lse, scale)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a.float(), b.float(), **tol)


def test_math_kernel_matches_autograd():
    """The math kernel's backward equals autograd's through softmax attention (one block)."""
    q, k, v = _inputs(hq=2, hkv=2, dv=4)
    w = torch.randn(2, 2, 5, 4)
    out, lse = ring.MathKernel.forward(q, k, v, 0.5)
    got = ring.MathKernel.backward(w, q, k, v, out, lse, 0.5)
    want = _grads(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.5), q, k, v, w)
    torch.testing.assert_close(out, want[0])
    for a, b in zip(got, want[1]):
        torch.testing.assert_close(a, b)


def test_default_kernel_choice():
    q, k, v = _inputs()
    assert ring.default_kernel(q, v) is ring.CpuFlashKernel
    assert ring.default_kernel(q, torch.zeros(2, 2, 7, 16)) is ring.MathKernel  # d_v != d
    assert ring.default_kernel(q.double(), v.double()) is ring.MathKernel


def test_ring_attention_empty_kv_gives_zeros():
    """No keys at all: the output is zero and gradients are zero (no NaN from -inf LSE)."""
    q, k, v = _inputs(skv=0)
    q.requires_grad_()
    out = fu.ring_attention(q, k, v)
    out.sum().backward()
    assert torch.equal(out, torch.zeros_like(out)) and torch.equal(q.grad, torch.zeros_like(q))


@pytest.mark.parametrize(
    "args,message",
    [
        ((torch.zeros(2, 4, 5), None, None), "q is shape (2, 4, 5): it must be a 4-d"),
        ((None, torch.zeros(1, 3, 5, 8), None), "k has 3 heads but q has 4: q's head count"),
        ((None, None, torch.zeros(2, 2, 6, 8)), "k and v must share b, h_kv and s_kv"),
    ],
)
def test_ring_attention_argument_refusals(args, message):
    q, k, v = _inputs()
    q, k, v = (a if a is not None else t for a, t in zip(args, (q, k, v)))
    if message.startswith("k has 3"):
        k = v = torch.zeros(2, 3, 7, 8)
    with pytest.raises(fu.FastUlyssesError) as error:
        fu.ring_attention(q, k, v)
    assert message in str(error.value)


def test_ring_attention_refuses_a_bad_ring_group_and_attn_fn():
    q, k, v = _inputs()
    with pytest.raises(fu.FastUlyssesError, match="ring_group is a str: it must be a torch"):
        fu.ring_attention(q, k, v, "ring")
    with pytest.raises(fu.FastUlyssesError, match="attn_fn is 3: it must be a callable"):
        fu.ring_attention(q, k, v, attn_fn=3)
    with pytest.raises(fu.FastUlyssesError, match=r"with a ring group it must return \(out, lse\)"):
        fu.ring_attention(q, k, v, attn_fn=lambda q, k, v: F.scaled_dot_product_attention(q, k, v))


def test_user_lse_not_differentiable_refused_at_forward_when_grads_are_to_come():
    """Refused before anything is sent (a refusal at backward could leave ring peers waiting);
    without gradients to come the same attn_fn runs."""
    q, k, v = _inputs(hkv=4)

    def detached(q, k, v):
        out, lse = usp.math_attn(q, k, v)
        return out, lse.detach()

    with torch.no_grad():
        fu.ring_attention(q, k, v, attn_fn=detached)
    q.requires_grad_()
    with pytest.raises(fu.FastUlyssesError, match="attn_fn's lse does not require grad"):
        fu.ring_attention(q, k, v, attn_fn=detached)


def test_scale_with_an_attn_fn_and_a_zero_head_dim_are_refused():
    q, k, v = _inputs(hkv=4)
    with pytest.raises(fu.FastUlyssesError, match="scale=0.5 with an attn_fn: attn_fn applies"):
        fu.ring_attention(q, k, v, attn_fn=usp.math_attn, scale=0.5)
    empty = torch.zeros(2, 4, 5, 0)
    with pytest.raises(fu.FastUlyssesError, match="its head dim .dim 3. must be at least 1"):
        fu.ring_attention(empty, empty, empty)


def test_double_backward_is_an_error_not_wrong_numbers():
    q, k, v = (t.double().requires_grad_() for t in _inputs(hkv=4))
    (dq,) = torch.autograd.grad(fu.ring_attention(q, k, v).sum(), (q,), create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad((dq**2).sum(), (q, k, v))


def test_float64_keeps_float64_accuracy():
    """float64 runs the math kernel and the merge in float64: gradcheck's precision."""
    q, k, v = (t.double().requires_grad_() for t in _inputs(hkv=2))
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    got = fu.ring_attention(q, k, v)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(lambda q: fu.ring_attention(q, k, v), (q,))


def test_ulysses_attention_ring_group_argument(world1):
    """ring_group must be a ProcessGroup; a ring of one rank is no ring (today's path, the
    same result); the group's own ring_group attribute is used when none is given."""
    with pytest.raises(fu.FastUlyssesError, match="ring_group is a int: it must be a torch"):
        fu.UlyssesAttention(ring_group=3)
    group = fu.TorchUlyssesGroup(world1)
    module = fu.UlyssesAttention(group, ring_group=world1)
    assert module._ring(group) is None  # size 1: no ring
    group.ring_group = world1
    assert fu.UlyssesAttention(group)._ring(group) is None
    q = torch.randn(1, 5, 2, 8)
    want = F.scaled_dot_product_attention(*(q.transpose(1, 2),) * 3).transpose(1, 2)
    torch.testing.assert_close(module(q, q, q), want)


def test_usp_example_matches_one_process():
    """`python examples/usp_attention.py` (4 CPU ranks, ring 2 x Ulysses 2, 10 heads: uneven
    over 2): every rank's output and q/k/v gradients equal one process's (it exits 1 on a
    mismatch, naming the rank)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "usp_attention.py"
    result = subprocess.run(
        [sys.executable, str(example)],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ, CUDA_VISIBLE_DEVICES=""),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 ranks: ring 2 x Ulysses 2" in result.stdout, result.stdout
    for rank in range(4):
        assert f"rank {rank}: Ulysses rank {rank % 2}, ring rank {rank // 2}" in result.stdout
    assert result.stdout.count("): ok") == 4, result.stdout
