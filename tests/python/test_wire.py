"""FP8 on the wire (fast_ulysses/wire.py, `wire_dtype=`; docs/API.md, "FP8 on the wire").

In process: the quantizer bit for bit against an independent torch reference of the rule, the
round-trip bound over every binade, zero / inf / NaN rows, the packed layout, the refusals, and
torch.compile of a wire call on a one-rank fallback. Multi-rank: one 3-rank gloo launch of
tests/workers/wire.py (TorchUlyssesGroup, P = 1, 2, 3), one test per check and P; a 4-rank
launch in the full tier."""

from __future__ import annotations

import pytest
import torch
import wire as worker  # the worker's check names

import fast_ulysses as fu
from fast_ulysses import wire

WORLD = 3
FORMATS = (torch.float8_e4m3fn, torch.float8_e5m2)
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
BOUND = {torch.float8_e4m3fn: 2**-4, torch.float8_e5m2: 2**-3}


def reference_packed(x: torch.Tensor, w: torch.dtype) -> torch.Tensor:
    """The rule, written apart from wire.py: per row (last dim) an fp32 scale amax * (1 / fmax)
    (the reciprocal rounded to fp32 first: CUDA's scalar division, on every device),
    payload x / scale saturated to +-fmax (0 where the scale is not > 0), the scale's bytes
    after the payload."""
    fmax = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}[w]
    rows = x.float().reshape(-1, x.shape[-1])
    out = []
    for row in rows:
        scale = row.abs().max() * torch.tensor(1.0 / fmax, dtype=torch.float32)
        if scale > 0:
            payload = torch.clamp(row / scale, -fmax, fmax).to(w)
        else:
            payload = torch.zeros_like(row).to(w)
        scale_bytes = scale.reshape(1).view(torch.uint8).view(w)
        out.append(torch.cat([payload, scale_bytes]))
    return torch.stack(out).reshape(*x.shape[:-1], x.shape[-1] + 4)


def bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("w", FORMATS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_quantize_is_the_reference_bit_for_bit(w, dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(2, 5, 3, 16, generator=g) * torch.rand(2, 5, 3, 1, generator=g) * 50).to(dtype)
    x[0, 1, 2] = 0
    x = x.transpose(1, 2)  # a strided input is read as it is
    packed = wire.quantize(x, w)
    assert packed.dtype == w and packed.shape == (2, 3, 5, 20) and packed.is_contiguous()
    assert torch.equal(bits(packed), bits(reference_packed(x, w)))
    payload, scales = wire.unpack(packed)
    assert payload.shape == (2, 3, 5, 16) and scales.shape == (2, 3, 5)
    assert scales.dtype == torch.float32 and scales._base is not None  # views (d % 4 == 0)
    want = (payload.float() * scales[..., None]).to(dtype)
    assert torch.equal(bits(wire.dequantize(payload, scales, dtype)), bits(want))


def rows_of_every_kind(d: int, dtype: torch.dtype) -> torch.Tensor:
    """(2, 7, 3, d): random rows of magnitudes 1e-6 to 1e6, then one row each of zeros, a +inf,
    a -inf, a NaN, values so small that the scale is subnormal, negative zeros."""
    g = torch.Generator().manual_seed(d)
    x = torch.randn(2, 7, 3, d, generator=g) * torch.logspace(-6, 6, 7)[None, :, None, None]
    x[0, 0, 0] = 0
    x[0, 0, 1, 0] = float("inf")
    x[0, 1, 0, -1] = float("-inf")
    x[0, 1, 1, d // 2] = float("nan")
    tiny = torch.finfo(dtype).tiny if dtype != torch.float32 else 1e-40  # (an fp32 subnormal)
    x[1, 0, 0] = torch.rand(d, generator=g) * tiny
    x[1, 0, 1] = -0.0
    return x.to(dtype)


def same_packed(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same payload bytes and scales; a NaN scale (a row with a NaN) matches any NaN: which
    NaN, its bits, is not part of the rule."""
    (pa, sa), (pb, sb) = wire.unpack(a), wire.unpack(b)
    nan = sa.isnan()
    return (
        torch.equal(bits(pa), bits(pb))
        and torch.equal(nan, sb.isnan())
        and torch.equal(sa[~nan].view(torch.int32), sb[~nan].view(torch.int32))
    )


def same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same dtype and bits, NaNs matching any NaN (which NaN is not part of the rule)."""
    nan = a.isnan()
    return (
        a.dtype == b.dtype
        and torch.equal(nan, b.isnan())
        and torch.equal(bits(a[~nan]), bits(b[~nan]))
    )


@pytest.mark.parametrize("d", [1, 4, 31, 100, 128])
@pytest.mark.parametrize("w", FORMATS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_ops_cpu_kernels_are_the_reference_bit_for_bit(w, dtype, d):
    """fast_ulysses::wire_quantize / wire_dequantize(_out) on the CPU (the rule of
    csrc/kernels/wire_rule.h) against wire.quantize_reference and this file's own row-by-row
    reference, on rows of every kind."""
    x = rows_of_every_kind(d, dtype)
    packed = torch.ops.fast_ulysses.wire_quantize(x, w)
    assert packed.dtype == w and packed.shape == (2, 7, 3, d + 4)
    assert same_packed(packed, wire.quantize_reference(x, w))
    assert same_packed(packed, reference_packed(x, w))
    want = wire.dequantize(*wire.unpack(packed), dtype)
    assert same_values(torch.ops.fast_ulysses.wire_dequantize(packed, dtype), want)
    out = torch.full_like(want, 7)
    assert torch.ops.fast_ulysses.wire_dequantize_out(packed, out=out) is out
    assert same_values(out, want)


def test_the_ops_meta_kernels_and_refusals():
    ops = torch.ops.fast_ulysses
    x = torch.empty(2, 3, 4, 128, dtype=torch.bfloat16, device="meta")
    packed = ops.wire_quantize(x, torch.float8_e5m2)
    assert packed.shape == (2, 3, 4, 132) and packed.dtype == torch.float8_e5m2
    y = ops.wire_dequantize(packed, torch.float16)
    assert y.shape == (2, 3, 4, 128) and y.dtype == torch.float16
    with pytest.raises(ValueError, match="wire_dtype=BFloat16: it must be torch.float8_e4m3fn"):
        ops.wire_quantize(x, torch.bfloat16)
    with pytest.raises(ValueError, match="x has dtype Int: a wire call takes bfloat16"):
        ops.wire_quantize(torch.zeros(2, 4, dtype=torch.int32), torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="its rows hold d \\+ 4 values"):
        ops.wire_dequantize(torch.zeros(2, 4).to(torch.float8_e4m3fn), torch.float32)
    with pytest.raises(ValueError, match="out is not contiguous"):
        ops.wire_dequantize_out(torch.zeros(4, 12).to(torch.float8_e4m3fn),
                                out=torch.zeros(8, 4).t())  # fmt: skip


def test_packed_row_is_the_payload_then_the_scale_bytes():
    x = torch.tensor([[[[1.0, -2.0, 0.5, 4.0, 3.0, 0.0]]]])  # d = 6: scales copied out
    packed = wire.quantize(x, torch.float8_e4m3fn)
    assert packed.shape == (1, 1, 1, 10)
    scale = torch.tensor([4.0 / 448.0])
    assert torch.equal(packed[..., 6:].reshape(-1).view(torch.uint8), scale.view(torch.uint8))
    assert torch.equal(packed[..., :6].float(), (x / scale).to(torch.float8_e4m3fn).float())
    assert wire.unpack(packed)[1].item() == scale.item()


@pytest.mark.parametrize("w", FORMATS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_within_the_documented_bound_over_every_binade(w, dtype):
    """max |deq - x| <= amax * 2^-4 (e4m3fn) / 2^-3 (e5m2) per row: every bf16 and fp16 row,
    fp32 rows whose amax is a normal float32 (2^-126 and up)."""
    # bf16 and fp16 from their smallest subnormal (2^-133, 2^-24), fp32 from 2^-126.
    low = {torch.bfloat16: -133, torch.float16: -24, torch.float32: -126}[dtype]
    g = torch.Generator().manual_seed(5)
    high = 15 if dtype == torch.float16 else 127  # the largest binade
    for e in range(low, high + 1):
        x = ((torch.rand(256, 16, generator=g) * 2 - 1) * 2.0**e).to(dtype)
        x[:, 0] = 2.0**e
        y = wire.dequantize(*wire.unpack(wire.quantize(x, w)), dtype).float()
        amax = x.float().abs().amax(-1, keepdim=True)
        assert ((y - x.float()).abs() <= amax * BOUND[w]).all(), f"rows of amax 2^{e}"


@pytest.mark.parametrize("w", FORMATS, ids=str)
def test_tiny_fp32_rows_come_back_finite(w):
    """Below 2^-126 (a subnormal fp32 scale) no relative bound, but no NaN and |error| <= amax."""
    for e in range(-149, -126):
        x = torch.full((4, 8), 2.0**e) * torch.linspace(-1, 1, 8)
        y = wire.dequantize(*wire.unpack(wire.quantize(x, w)))
        assert y.isfinite().all() and ((y - x).abs() <= x.abs().amax(-1, keepdim=True)).all()


@pytest.mark.parametrize("w", FORMATS, ids=str)
def test_zero_inf_and_nan_rows(w):
    x = torch.randn(5, 8, dtype=torch.bfloat16)
    x[0] = 0
    x[1, 3] = float("inf")
    x[2, 5] = float("-inf")
    x[3, 1] = float("nan")
    y = wire.dequantize(*wire.unpack(wire.quantize(x, w)), torch.bfloat16)
    assert torch.equal(bits(y[0]), bits(torch.zeros(8, dtype=torch.bfloat16)))  # +0 exactly
    assert y[1:4].isnan().all()
    assert y[4].isfinite().all()


def test_simulate_with_a_wire_dtype():
    xs = [torch.randn(1, s, 3, 8, dtype=torch.float16) for s in (2, 1)]
    want = fu.simulate([wire.dequantize(*wire.unpack(wire.quantize(x, torch.float8_e5m2)),
                                        torch.float16) for x in xs], 0, seq_splits=[2, 1],
                                        head_splits=[2, 1])  # fmt: skip
    got = fu.simulate(xs, 0, seq_splits=[2, 1], head_splits=[2, 1], wire_dtype=torch.float8_e5m2)
    assert all(torch.equal(bits(a), bits(b)) and a.dtype == b.dtype for a, b in zip(got, want))


@pytest.mark.parametrize(
    "call, match",
    [
        (dict(wire_dtype=torch.int8), r"wire_dtype=torch.int8: it must be torch.float8_e4m3fn"),
        (dict(wire_dtype=torch.float16), r"wire_dtype=torch.float16: it must be"),
        (dict(wire_dtype="fp8"), r"wire_dtype='fp8'"),
        (dict(wire_dtype=torch.float8_e4m3fn, dequantize=1), r"dequantize=1: it must be a bool"),
        (dict(dequantize=False), r"dequantize=False without wire_dtype"),
        (
            dict(wire_dtype=torch.float8_e4m3fn, out=torch.empty(1, 4, 4, 8)),
            r"out is a torch.float32 tensor on cpu: with wire_dtype it must be a contiguous "
            r"torch.bfloat16",
        ),
        (
            dict(wire_dtype=torch.float8_e4m3fn, out=torch.empty(1, 4, 4, 9, dtype=torch.bfloat16)),
            r"out has shape \(1, 4, 4, 9\): it must have the call's output shape \(1, 4, 4, 8\)",
        ),
        (
            dict(wire_dtype=torch.float8_e4m3fn, dequantize=False, out=torch.empty(0)),
            r"out= with dequantize=False",
        ),
    ],
)
def test_owned_call_refusals(world1, call, match):
    group = fu.TorchUlyssesGroup(world1)
    try:
        with pytest.raises(fu.FastUlyssesError, match=match):
            group.all_to_all_single_4d(torch.ones(1, 4, 4, 8, dtype=torch.bfloat16), 0, "r", **call)
    finally:
        group.destroy()


def test_input_dtype_grad_and_borrowed_refusals(world1):
    group = fu.TorchUlyssesGroup(world1)
    e4m3 = torch.float8_e4m3fn
    try:
        with pytest.raises(fu.FastUlyssesError, match=r"x has dtype torch.int32: a call with "):
            group.all_to_all_single_4d(
                torch.ones(1, 4, 4, 8, dtype=torch.int32), 0, wire_dtype=e4m3
            )
        with pytest.raises(fu.FastUlyssesError, match=r"x has dtype torch.float8_e5m2"):
            group.all_to_all_single_4d(torch.ones(1, 4, 4, 8).to(torch.float8_e5m2), 0,
                                       wire_dtype=e4m3)  # fmt: skip
        x = torch.ones(1, 4, 4, 8, requires_grad=True)
        with pytest.raises(fu.FastUlyssesError, match=r"dequantize=False with an input that "):
            group.all_to_all_single_4d(x, 0, wire_dtype=e4m3, dequantize=False)
        with pytest.raises(ValueError, match=r"requires grad"):
            group.all_to_all_single_4d_borrowed(x, 0, "b", wire_dtype=e4m3)
        with pytest.raises(fu.FastUlyssesError, match=r"barrier=False with wire_dtype and "):
            group.all_to_all_single_4d_borrowed(x.detach(), 0, "b", wire_dtype=e4m3, barrier=False)
        odd = torch.ones(1, 4, 4, 6)  # d = 6: the scales are not 4-byte aligned in a window
        with pytest.raises(fu.FastUlyssesError, match=r"barrier=False with wire_dtype and d = 6"):
            group.all_to_all_single_4d_borrowed(
                odd, 0, "b", wire_dtype=e4m3, dequantize=False, barrier=False
            )
        with pytest.raises(fu.FastUlyssesError, match=r"x has shape \(1, 4, 4, 0\): a call with"):
            group.all_to_all_single_4d(torch.ones(1, 4, 4, 0), 0, wire_dtype=e4m3)
        with pytest.raises(fu.FastUlyssesError, match=r"wire_dtype=torch.int8"):
            fu.UlyssesAttention(group, wire_dtype=torch.int8)
        assert group.stats()["tags"] == 0  # nothing was sent
    finally:
        group.destroy()


def test_borrowed_without_dequantize_defers_like_any_borrowed_call(world1):
    group = fu.TorchUlyssesGroup(world1)
    x = torch.randn(1, 4, 2, 8)
    try:
        payload, scales = group.all_to_all_single_4d_borrowed(
            x, 0, "b", wire_dtype=torch.float8_e4m3fn, dequantize=False, barrier=False
        )
        group.barrier()
        y = wire.dequantize(payload, scales)
        assert torch.equal(y, wire.dequantize(*wire.unpack(wire.quantize(x, torch.float8_e4m3fn))))
    finally:
        group.destroy()


@pytest.mark.parametrize(
    "backend",
    ["aot_eager", pytest.param("inductor", marks=pytest.mark.full)],  # (a C++ build)
)
def test_torch_compile_of_a_wire_call_on_the_fallback(world1, backend):
    group = fu.TorchUlyssesGroup(world1)
    x = torch.randn(1, 6, 4, 8, requires_grad=True)

    def step(t):
        return group.all_to_all_single_4d(t, 0, "c", wire_dtype=torch.float8_e4m3fn) * 2

    try:
        torch._dynamo.reset()
        got = torch.compile(step, backend=backend)(x)
        got.sum().backward()
        grad, x.grad = x.grad, None
        want = step(x)
        want.sum().backward()
        assert torch.equal(got, want) and torch.equal(grad, x.grad)
        assert torch.equal(grad, torch.full_like(x, 2.0))  # straight-through
    finally:
        group.destroy()


# -- multi-rank ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ranks(launch_ranks):
    return launch_ranks("wire", WORLD, timeout=300)


@pytest.mark.parametrize("check", worker.check_names(WORLD))
def test_worker_check(ranks, check):
    P = int(check.rsplit("_P", 1)[1])
    ranks.assert_check(check, ranks=range(WORLD - P, WORLD))


def test_all_ranks_exit_cleanly(ranks):
    ranks.assert_clean_exit()


@pytest.mark.full  # a second launch (4 ranks); the 3-rank one above covers every check
def test_worker_at_four_ranks(launch_ranks):
    launch = launch_ranks("wire", 4, timeout=400)
    for check in worker.check_names(4):
        launch.assert_check(check, ranks=range(4 - int(check.rsplit("_P", 1)[1]), 4))
    launch.assert_clean_exit()
