"""The fused QK RMSNorm + RoPE scatter's math and its fallback, on CPU: `norm_rope_reference`
against an independent formulation (torch's rms_norm, complex multiplication for interleaved
pairs, rotate-half for the half style), the argument rules (the C++ op check_norm_rope), and
`qk_norm_rope_all_to_all` on TorchUlyssesGroup over 3 gloo ranks against reference + simulate."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest
import torch

import fast_ulysses as fu
from fast_ulysses.fused import NORMS, ROPE_STYLES, norm_rope_reference


def independent(x, w, eps, cos, sin, norm, style, layout):
    """The issue's formulas written another way, in float64."""
    x = x.double() if layout == "bshd" else x.double().transpose(0, 1)
    B, S, N, D = x.shape
    if norm == "all_heads":
        y = torch.nn.functional.rms_norm(x, (N, D), w.double().reshape(N, D), eps)
    else:
        y = torch.nn.functional.rms_norm(x, (D,), w.double(), eps)
    angle = torch.atan2(sin.double(), cos.double()).reshape(1, S, 1, D // 2)
    if style == "interleaved":
        z = torch.view_as_complex(y.reshape(B, S, N, D // 2, 2).contiguous())
        out = torch.view_as_real(z * torch.polar(torch.ones_like(angle), angle)).reshape(B, S, N, D)
    else:
        c = torch.cat((angle.cos(), angle.cos()), -1)
        s = torch.cat((angle.sin(), angle.sin()), -1)
        rotated = torch.cat((-y[..., D // 2 :], y[..., : D // 2]), -1)
        out = y * c + rotated * s
    return out if layout == "bshd" else out.transpose(0, 1)


def inputs(layout, norm, dtype=torch.float32, B=2, S=5, N=3, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (B, S, N, D) if layout == "bshd" else (S, B, N, D)
    x = (torch.randn(shape, generator=g) * 3).to(dtype)
    w = torch.rand(N * D if norm == "all_heads" else D, generator=g) + 0.5
    angle = torch.rand(S, D // 2, generator=g) * 6.28
    return x, w, angle.cos(), angle.sin()


@pytest.mark.parametrize(
    "norm,style,layout", list(itertools.product(NORMS, ROPE_STYLES, ("bshd", "sbhd")))
)
def test_reference_matches_the_formulas(norm, style, layout):
    x, w, c, s = inputs(layout, norm)
    got = norm_rope_reference(x, w, 1e-6, c, s, norm=norm, rope_style=style, layout=layout)
    want = independent(x, w, 1e-6, c, s, norm, style, layout)
    assert got.dtype == x.dtype and got.shape == x.shape
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_reference_rounds_once_to_the_input_dtype():
    x, w, c, s = inputs("bshd", "per_head", dtype=torch.bfloat16)
    got = norm_rope_reference(x, w, 1e-6, c, s, norm="per_head", rope_style="half")
    want = independent(x, w, 1e-6, c, s, "per_head", "half", "bshd")
    assert got.dtype == torch.bfloat16
    # one rounding of a float32 result: within one bf16 ulp of the float64 formula
    ulp = (torch.nextafter(got, torch.full_like(got, float("inf"))).double() - got.double()).abs()
    assert bool(((got.double() - want).abs() <= ulp).all())


BAD = {
    "norm": (dict(norm="rms"), "norm='rms': must be 'all_heads'"),
    "rope_style": (dict(rope_style="full"), "rope_style='full': must be 'interleaved'"),
    "layout": (dict(layout="bhsd"), "layout='bhsd': the fused norm + RoPE scatter takes"),
    "weight size": (dict(weight=torch.ones(8)), "norm_weight has shape [8]"),
    "weight dtype": (
        dict(weight=torch.ones(24, dtype=torch.float16)),
        "float32 tensor of shape [24]",
    ),
    "cos shape": (dict(cos=torch.ones(5, 3)), "cos has shape [5, 3]"),
    "sin dtype": (
        dict(sin=torch.ones(5, 4, dtype=torch.float64)),
        "sin has shape [5, 4] and dtype Double",
    ),
    "odd d": (dict(x=torch.zeros(2, 5, 3, 7)), "head_dim must be even"),
    "int x": (
        dict(x=torch.zeros(2, 5, 3, 8, dtype=torch.int32)),
        "takes bfloat16, float16 or float32",
    ),
    "eps": (dict(eps=0.0), "eps=0: must be a finite number > 0"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_arguments_name_the_rule(case):
    x, w, c, s = inputs("bshd", "all_heads")
    args = dict(
        x=x, weight=w, eps=1e-6, cos=c, sin=s, norm="all_heads", rope_style="half", layout="bshd"
    )
    change, needle = BAD[case]
    args.update(change)
    with pytest.raises(ValueError, match=re.escape(needle)):
        norm_rope_reference(
            args["x"],
            args["weight"],
            args["eps"],
            args["cos"],
            args["sin"],
            norm=args["norm"],
            rope_style=args["rope_style"],
            layout=args["layout"],
        )


def test_fallback_refuses_an_input_that_requires_grad(world1):
    x, w, c, s = inputs("bshd", "all_heads")
    group = fu.TorchUlyssesGroup(world1)
    with pytest.raises(ValueError, match="has no backward"):
        fu.qk_norm_rope_all_to_all(
            group, x.requires_grad_(), "q", norm_weight=w, eps=1e-6, cos=c, sin=s
        )


def test_a_process_group_is_refused_naming_the_group_types(world1):
    """A ProcessGroup (or anything not a fast-ulysses group) is a ValueError before any math,
    not an AttributeError after the norm and RoPE."""
    x, w, c, s = inputs("bshd", "all_heads")
    for group in (world1, None):
        with pytest.raises(ValueError, match="must be a UlyssesGroup or a TorchUlyssesGroup"):
            fu.qk_norm_rope_all_to_all(group, x, "q", norm_weight=w, eps=1e-6, cos=c, sin=s)


@pytest.mark.parametrize("tags", [("q", "q"), ("q",), "qk", 7])  # one tag twice, short, a str
def test_qk_needs_two_different_tags(world1, tags):
    """The q-and-k call refuses its tags before any math or call."""
    x, w, c, s = inputs("bshd", "all_heads")
    group = fu.TorchUlyssesGroup(world1)
    rule = r"it must be a tuple or list of 2 different tags \(q's, k's\)"
    with pytest.raises(ValueError, match=f"tags is {re.escape(repr(tags))}: {rule}"):
        fu.qk_norm_rope_all_to_all_qk(
            group, x, x, tags, norm_weights=(w, w), eps=1e-6, cos=c, sin=s
        )


@pytest.mark.parametrize("case", sorted(BAD))
def test_the_fallbacks_refusals_are_fast_ulysses_errors(world1, case):
    """Every argument rule of the C++ check reaches a caller of qk_norm_rope_all_to_all on the
    fallback group as FastUlyssesError, its message unchanged (before: a plain ValueError)."""
    x, w, c, s = inputs("bshd", "all_heads")
    args = dict(
        x=x, weight=w, eps=1e-6, cos=c, sin=s, norm="all_heads", rope_style="half", layout="bshd"
    )
    change, needle = BAD[case]
    args.update(change)
    with pytest.raises(fu.FastUlyssesError, match=re.escape(needle)):
        fu.qk_norm_rope_all_to_all(
            fu.TorchUlyssesGroup(world1),
            args["x"],
            "q",
            norm_weight=args["weight"],
            eps=args["eps"],
            cos=args["cos"],
            sin=args["sin"],
            norm=args["norm"],
            rope_style=args["rope_style"],
            layout=args["layout"],
        )


BAD_TYPES = {  # an argument of a type the op's schema refuses without naming it
    "eps str": (dict(eps="1e-6"), "eps is '1e-6': it must be a finite number > 0"),
    "eps None": (dict(eps=None), "eps is None: it must be a finite number > 0"),
    "eps bool": (dict(eps=True), "eps is True: it must be a finite number > 0"),
    "norm None": (dict(norm=None), f"norm is None: it must be a str, one of {NORMS}"),
    "rope_style int": (
        dict(rope_style=1),
        f"rope_style is 1: it must be a str, one of {ROPE_STYLES}",
    ),
    "layout None": (dict(layout=None), "layout is None: it must be a str"),
    "x None": (dict(x=None), "x is a NoneType: it must be a torch.Tensor"),
    "norm_weight list": (
        dict(norm_weight=[1.0] * 24),
        "norm_weight is a list: it must be a torch.Tensor",
    ),
    "cos None": (dict(cos=None), "cos is a NoneType: it must be a torch.Tensor"),
}


@pytest.mark.parametrize("case", sorted(BAD_TYPES))
def test_argument_types_are_named(world1, case):
    """Arguments of the wrong type raise FastUlyssesError naming the argument (before:
    TypeError from the math, or torch's schema RuntimeError)."""
    x, w, c, s = inputs("bshd", "all_heads")
    args = dict(x=x, norm_weight=w, eps=1e-6, cos=c, sin=s)
    change, needle = BAD_TYPES[case]
    args.update(change)
    x = args.pop("x")
    with pytest.raises(fu.FastUlyssesError, match=re.escape(needle)):
        fu.qk_norm_rope_all_to_all(fu.TorchUlyssesGroup(world1), x, "q", **args)


@pytest.mark.parametrize("weights", [None, "w", "one"])
def test_qk_needs_two_norm_weights(world1, weights):
    x, w, c, s = inputs("bshd", "all_heads")
    weights = {"w": w, "one": (w,)}.get(weights)
    rule = "it must be a tuple or list of 2 tensors (q's, k's)"
    with pytest.raises(
        fu.FastUlyssesError, match=re.escape(f"norm_weights is {weights!r}: {rule}")
    ):
        fu.qk_norm_rope_all_to_all_qk(
            fu.TorchUlyssesGroup(world1), x, x, norm_weights=weights, eps=1e-6, cos=c, sin=s
        )


BAD_K = {  # k (or k's norm weight) refused by k's call only, with the message of k's call
    "odd head_dim": (
        dict(k=torch.zeros(2, 5, 3, 7)),
        "k's call: x has head_dim 7: RoPE rotates pairs, so head_dim must be even",
    ),
    "k's norm weight": (dict(wk=torch.ones(8)), "k's call: norm_weight has shape [8]"),
    "k requires grad": (
        dict(k=torch.zeros(2, 5, 3, 8, requires_grad=True)),
        "k's call: x requires grad, but qk_norm_rope_all_to_all has no backward",
    ),
    "k on meta": (
        dict(k=torch.zeros(2, 5, 3, 8, device="meta")),
        "k's call: norm_weight is on cpu but x is on meta",
    ),
    "k's head splits": (
        dict(k=torch.zeros(2, 5, 2, 8), wk=torch.ones(8), norm="per_head", head_splits=[3]),
        "k's call: head_splits",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_K))
def test_qk_checks_k_before_qs_call(world1, case):
    """A k that k's call refuses is refused before q's borrowed call goes out, so the group
    stays usable: the next q-and-k call works and matches the reference (before, q's tag was
    left waiting for barrier() and every later call on it was refused)."""
    x, w, c, s = inputs("bshd", "all_heads")
    group = fu.TorchUlyssesGroup(world1)
    change, needle = BAD_K[case]
    args = dict(k=x, wq=w, wk=w, norm="all_heads", head_splits=None)
    if change.get("norm") == "per_head":
        args["wq"] = torch.ones(8)
    args.update(change)
    with pytest.raises(fu.FastUlyssesError, match=re.escape(needle)):
        fu.qk_norm_rope_all_to_all_qk(
            group,
            x,
            args["k"],
            norm_weights=(args["wq"], args["wk"]),
            eps=1e-6,
            cos=c,
            sin=s,
            norm=args["norm"],
            head_splits=args["head_splits"],
        )
    q, k = fu.qk_norm_rope_all_to_all_qk(group, x, x, norm_weights=(w, w), eps=1e-6, cos=c, sin=s)
    want = norm_rope_reference(x, w, 1e-6, c, s)  # P = 1: the all-to-all is the identity
    assert torch.equal(q, want) and torch.equal(k, want)


def test_qk_reads_one_shot_split_iterators_once(world1):
    """Splits given as iterators are read once for both calls (before, q's call used them up
    and k's was refused after q's had gone out)."""
    x, w, c, s = inputs("bshd", "all_heads")
    group = fu.TorchUlyssesGroup(world1)
    q, k = fu.qk_norm_rope_all_to_all_qk(
        group,
        x,
        x,
        norm_weights=(w, w),
        eps=1e-6,
        cos=c,
        sin=s,
        seq_splits=iter([5]),
        head_splits=iter([3]),
    )
    want = norm_rope_reference(x, w, 1e-6, c, s)
    assert torch.equal(q, want) and torch.equal(k, want)


@pytest.fixture(scope="module")
def three_ranks(launch_ranks):
    return launch_ranks("fused_torch_group", 3, timeout=240, env={"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize("check", ["matches_reference", "qk_pair"])
def test_fallback_on_gloo_ranks(three_ranks, check):
    three_ranks.assert_check(check)


def test_fallback_ranks_exit_cleanly(three_ranks):
    three_ranks.assert_clean_exit()


@pytest.mark.full  # the fused feature's fast multi-rank check: fused_torch_group above
def test_the_wan_fused_attention_example_matches_one_process():
    import subprocess
    import sys

    example = Path(__file__).resolve().parents[2] / "examples" / "wan_fused_attention.py"
    result = subprocess.run(
        [sys.executable, str(example)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Wan attention block, 12 heads" in result.stdout and ": ok" in result.stdout, (
        result.stdout
    )


def test_the_fused_op_traces_through_its_meta_kernel(world1):
    """torch.compile sees the fused op's output shape (the mode-0 output) and its argument rules
    without a GPU: the Meta kernel."""
    x, w, c, s = (t.to("meta") for t in inputs("bshd", "all_heads"))
    out = torch.ops.fast_ulysses.qk_norm_rope_all_to_all(x, "q", world1.group_name, w, 1e-6, c, s)
    assert out.device.type == "meta" and out.shape == x.shape  # P = 1: the same shape
    with pytest.raises(ValueError, match="norm='rms'"):
        torch.ops.fast_ulysses.qk_norm_rope_all_to_all(
            x, "q", world1.group_name, w, 1e-6, c, s, "rms"
        )


def test_the_fallbacks_unfused_math_traces_in_one_graph():
    """The fallback's norm and RoPE (norm_rope_reference) compile without a graph break: its
    argument check is the op check_norm_rope, which a trace keeps (a plain function of the
    module would break the graph there), and a bad call is refused while tracing."""
    import torch._dynamo

    x, w, c, s = inputs("bshd", "all_heads")
    torch._dynamo.reset()
    compiled = torch.compile(norm_rope_reference, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x, w, 1e-6, c, s), norm_rope_reference(x, w, 1e-6, c, s))
    with pytest.raises(Exception, match="norm='rms'"):
        compiled(x, w, 1e-6, c, s, norm="rms")
