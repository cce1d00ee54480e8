"""The fused QK RMSNorm + RoPE scatter: q or k normalised, rotated and sent by the mode-0
all-to-all in one pass over memory (an opt-in SM path beside the zero-SM copy path).

On `UlyssesGroup` one CUDA kernel reads each token's row once, normalises and rotates it in
float32, and stores each head straight into the window of the rank that owns it; the call's
handshake and windows are those of `all_to_all_single_4d`. On `TorchUlyssesGroup` the same math
runs unfused (`norm_rope_reference`), then the all-to-all. Both check their arguments with the
same C++ rules (the op `check_norm_rope`), so a bad call reads the same on either group.

The math, per token of this rank's input x (mode-0 layout, bshd or sbhd), in float32, rounded
to x's dtype once at the end:

- RMSNorm: norm="all_heads" (Wan): y = x * rsqrt(mean(x^2 over the token's N*d values) + eps)
  * w, w of shape (N*d,); norm="per_head" (HunyuanVideo): the mean is over each head's d
  values, w of shape (d,).
- RoPE with c = cos[s, i], t = sin[s, i] (cos, sin: float32 (s_local, d/2), this rank's rows):
  rope_style="interleaved" (Wan) rotates the pairs (y[2i], y[2i+1]), "half" (rotate-half) the
  pairs (y[i], y[i+d/2]): (a, b) -> (a*c - b*t, a*t + b*c).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch

from ._ops import _C, ops
from .arguments import as_splits, check_tag, check_tags
from .call import make_call
from .errors import FastUlyssesError, refused
from .plan import cached_plan

# The names norm= and rope_style= take, read from their one definition (C++, the op's checks).
NORMS, ROPE_STYLES = _C.NORMS, _C.ROPE_STYLES


def norm_rope_reference(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    *,
    norm: str = "all_heads",
    rope_style: str = "interleaved",
    layout: str = "bshd",
) -> torch.Tensor:
    """The unfused math above, in torch (the fallback's path and the tests' reference).

    Arguments are those of `qk_norm_rope_all_to_all`, checked by the same rules.

    Returns:
        A tensor shaped and typed like x.

    Raises:
        FastUlyssesError naming the argument and the rule (`_check_args`).
    """
    eps = _check_args(x, norm_weight, eps, cos, sin, norm, rope_style, layout)
    xf = x.float()
    b_s_n_d = xf if layout == "bshd" else xf.transpose(0, 1)  # a (b, s, N, d) view
    B, S, N, D = b_s_n_d.shape
    if norm == "all_heads":
        flat = b_s_n_d.reshape(B, S, N * D)
        y = flat * torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
        y = y.reshape(B, S, N, D)
    else:
        y = b_s_n_d * torch.rsqrt(b_s_n_d.pow(2).mean(-1, keepdim=True) + eps) * norm_weight
    c = cos.reshape(1, S, 1, D // 2)
    t = sin.reshape(1, S, 1, D // 2)
    if rope_style == "interleaved":
        a, b = y[..., 0::2], y[..., 1::2]
        out = torch.stack((a * c - b * t, a * t + b * c), dim=-1).reshape(B, S, N, D)
    else:
        a, b = y[..., : D // 2], y[..., D // 2 :]
        out = torch.cat((a * c - b * t, a * t + b * c), dim=-1)
    out = out if layout == "bshd" else out.transpose(0, 1)
    return out.to(x.dtype).contiguous()


def _check_args(x, norm_weight, eps, cos, sin, norm, rope_style, layout) -> float:
    """The argument rules of the fused call (`qk_norm_rope_all_to_all`'s arguments):
    `_check_types`, then the C++ rules (the op `check_norm_rope`, which a trace keeps).

    Returns:
        eps as a float.

    Raises:
        FastUlyssesError naming the argument, its value and the rule.
    """
    eps = _check_types(x, norm_weight, eps, cos, sin, norm, rope_style, layout)
    try:
        ops.check_norm_rope(x, norm_weight, eps, cos, sin, norm, rope_style, layout)
    except ValueError as error:
        raise refused(error) from None
    return eps


def _check_types(x, norm_weight, eps, cos, sin, norm, rope_style, layout) -> float:
    """The types the fused op's schema would refuse without naming the argument: x,
    norm_weight, cos and sin tensors, norm, rope_style and layout str, eps a real number (not a
    bool). A few isinstance checks: the fast path's per-call cost.

    Returns:
        eps as a float.

    Raises:
        FastUlyssesError naming the argument, its value and the rule.
    """
    Tensor = torch.Tensor
    if not (
        isinstance(x, Tensor)
        and isinstance(norm_weight, Tensor)
        and isinstance(cos, Tensor)
        and isinstance(sin, Tensor)
    ):
        for name, t in (("x", x), ("norm_weight", norm_weight), ("cos", cos), ("sin", sin)):
            if not isinstance(t, Tensor):
                raise FastUlyssesError(f"{name} is a {type(t).__name__}: it must be a torch.Tensor")
    if not (isinstance(norm, str) and isinstance(rope_style, str) and isinstance(layout, str)):
        for name, value, rule in (
            ("norm", norm, f"one of {NORMS}"),
            ("rope_style", rope_style, f"one of {ROPE_STYLES}"),
            ("layout", layout, "the layout's name"),
        ):
            if not isinstance(value, str):
                raise FastUlyssesError(f"{name} is {value!r}: it must be a str, {rule}")
    if type(eps) is not float and (isinstance(eps, bool) or not isinstance(eps, numbers.Real)):
        raise FastUlyssesError(f"eps is {eps!r}: it must be a finite number > 0 (a float)")
    return float(eps)


def qk_norm_rope_all_to_all(
    group,
    x: torch.Tensor,
    tag: str,
    *,
    norm_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm: str = "all_heads",
    rope_style: str = "interleaved",
    seq_splits: Sequence[int] | None = None,
    head_splits: Sequence[int] | None = None,
    layout: str = "bshd",
    borrowed: bool = False,
    barrier: bool = True,
    wire_dtype: torch.dtype | None = None,
    dequantize: bool = True,
) -> torch.Tensor:
    """RMSNorm and RoPE on this rank's q or k, then the mode-0 all-to-all; collective.

    Arguments:
        group: a `UlyssesGroup` (one fused kernel) or a `TorchUlyssesGroup` (unfused math,
            then the all-to-all).
        x: this rank's q or k in mode-0 input layout, (b, s_local, N, d) for bshd or
            (s_local, b, N, d) for sbhd; bfloat16, float16 or float32; d even.
        tag, seq_splits, head_splits, layout: as for `all_to_all_single_4d` (bshd or sbhd).
        norm_weight: float32, (N*d,) for norm="all_heads", (d,) for "per_head".
        eps: the RMSNorm epsilon (> 0).
        cos, sin: float32 (s_local, d/2): the angles of this rank's rows.
        norm: "all_heads" (Wan) or "per_head" (HunyuanVideo).
        rope_style: "interleaved" (Wan, complex pairs) or "half" (rotate-half).
        borrowed: return the window (`all_to_all_single_4d_borrowed`'s rules) instead of a new
            tensor; barrier=False then defers the closing handshake to `group.barrier()`.
        wire_dtype, dequantize: FP8 on the wire (`fast_ulysses.wire`). On either group the
            norm and RoPE then run unfused (`norm_rope_reference`), then the wire call: the
            quantize is not yet folded into the fused kernel.

    Returns:
        This rank's mode-0 output, (b, S, head_splits[r], d) for bshd, in x's dtype.

    Raises:
        FastUlyssesError naming the argument and the rule (`_check_types`, the C++
        check_norm_rope, then the plan's), before anything is sent; for an x that requires
        grad: the fused path has no backward.
    """
    fallback = _check_group(group)
    check_tag(tag)
    eps = _check_types(x, norm_weight, eps, cos, sin, norm, rope_style, layout)
    _check_grad(x)
    kw = dict(seq_splits=seq_splits, head_splits=head_splits, layout=layout)
    if wire_dtype is not None or dequantize is not True:
        kw.update(wire_dtype=wire_dtype, dequantize=dequantize)
    if fallback or "wire_dtype" in kw:
        y = norm_rope_reference(
            x, norm_weight, eps, cos, sin, norm=norm, rope_style=rope_style, layout=layout
        )
        if borrowed:
            return group.all_to_all_single_4d_borrowed(y, 0, tag, barrier=barrier, **kw)
        return group.all_to_all_single_4d(y, 0, tag, **kw)
    if torch.compiler.is_compiling():
        borrowed = False  # traced as the owned call, as the borrowed all-to-all is
    name = "qk_norm_rope_all_to_all" + ("_borrowed" if borrowed else "")
    try:
        group._before_call(
            make_call(name, x, 0, tag, seq_splits, head_splits, layout, bool(barrier))
        )
        return ops.qk_norm_rope_all_to_all(
            x,
            tag,
            group.group_name,
            norm_weight,
            eps,
            cos,
            sin,
            norm,
            rope_style,
            as_splits(seq_splits, "seq_splits"),
            as_splits(head_splits, "head_splits"),
            layout,
            bool(borrowed),
            bool(barrier),
            group.rank,
        )
    except ValueError as error:  # the op's checks (C++) raise ValueError
        raise refused(error) from None


def _check_group(group) -> bool:
    """The group's `fallback` (both groups have it; a cheap per-call test), or
    FastUlyssesError for anything else."""
    fallback = getattr(group, "fallback", None)
    if fallback is None:
        raise FastUlyssesError(
            f"group is a {type(group).__name__}: it must be a UlyssesGroup or a "
            f"TorchUlyssesGroup (fast_ulysses.make_group(process_group) builds one)"
        )
    return fallback


def _check_grad(x) -> None:
    if torch.is_grad_enabled() and x.requires_grad:
        raise FastUlyssesError(
            "x requires grad, but qk_norm_rope_all_to_all has no backward: for "
            "training, apply the norm and RoPE with torch, then "
            "group.all_to_all_single_4d (autograd-aware)"
        )


def qk_norm_rope_all_to_all_qk(
    group,
    q: torch.Tensor,
    k: torch.Tensor,
    tags: tuple[str, str] = ("q", "k"),
    *,
    norm_weights: tuple[torch.Tensor, torch.Tensor],
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    norm: str = "all_heads",
    rope_style: str = "interleaved",
    seq_splits: Sequence[int] | None = None,
    head_splits: Sequence[int] | None = None,
    layout: str = "bshd",
) -> tuple[torch.Tensor, torch.Tensor]:
    """q and k through `qk_norm_rope_all_to_all` with one closing handshake for both: two
    borrowed calls with barrier=False, then one `group.barrier()`. Returns the two borrowed
    results (valid until the next call with their tags); `norm_weights` is (q's, k's).

    Raises:
        As `qk_norm_rope_all_to_all`, and FastUlyssesError for tags or norm_weights that are
        not two; k's arguments are checked before q's call is issued (a refusal of k's call
        once q's is out would leave q's tag waiting for `barrier()`).
    """
    tags = check_tags(tags, ("q's", "k's"))
    if not isinstance(norm_weights, (tuple, list)) or len(norm_weights) != 2:
        raise FastUlyssesError(
            f"norm_weights is {norm_weights!r}: it must be a tuple or list of 2 tensors (q's, k's)"
        )
    seq_splits = as_splits(seq_splits, "seq_splits")  # once: an iterator is read once
    head_splits = as_splits(head_splits, "head_splits")
    _check_k(
        group,
        q,
        k,
        (norm_weights[1], eps, cos, sin, norm, rope_style, layout),
        seq_splits,
        head_splits,
    )
    out = tuple(
        qk_norm_rope_all_to_all(
            group,
            t,
            tag,
            norm_weight=w,
            eps=eps,
            cos=cos,
            sin=sin,
            norm=norm,
            rope_style=rope_style,
            seq_splits=seq_splits,
            head_splits=head_splits,
            layout=layout,
            borrowed=True,
            barrier=False,
        )
        for t, tag, w in zip((q, k), tags, norm_weights)
    )
    group.barrier()
    return out


def _check_k(group, q, k, args, seq_splits, head_splits) -> None:
    """The rules k's call (`qk_norm_rope_all_to_all(group, k, ...)`, args its norm_weight, eps,
    cos, sin, norm, rope_style and layout) checks, checked before q's call is issued: its
    arguments (`_check_args`), grad, q's device, and its plan where its shape or dtype are not
    q's (q's call checks q's plan before anything is sent).

    Raises:
        FastUlyssesError: "k's call: " and the message k's call would raise (naming x).
    """
    try:
        _check_group(group)
        _check_args(k, *args)
        _check_grad(k)
        if not isinstance(q, torch.Tensor):
            return  # q's call refuses it
        if k.device != q.device:
            raise FastUlyssesError(
                f"x (k) is on {k.device} but q is on {q.device}: q and k must be on one device"
            )
        if k.shape != q.shape or k.dtype != q.dtype:
            cached_plan(
                group.world_size,
                group.rank,
                0,
                tuple(k.shape),
                k.element_size(),
                None if seq_splits is None else tuple(seq_splits),
                None if head_splits is None else tuple(head_splits),
                args[-1],
            )
    except FastUlyssesError as error:
        raise FastUlyssesError(f"k's call: {error}") from None
