"""FP8 on the wire: the one rule by which a call's rows are quantized, packed, moved and
dequantized (`wire_dtype=` on both groups' owned and borrowed calls, `all_to_all_4d`,
`UlyssesAttention`, `qk_norm_rope_all_to_all` and `simulate`, which all come here).

The rule, per (token, head) row (the last dimension, d), in float32:

- scale = amax(|x| over d) * (1 / fmax), fmax = `torch.finfo(wire_dtype).max` (448 for
  e4m3fn, 57344 for e5m2), the reciprocal rounded to float32 first;
- payload = (x / scale) saturated to [-fmax, fmax], then rounded to the wire dtype, where
  scale > 0, else 0. The saturation only matters where the float32 scale is subnormal (amax
  below fmax * 2^-126); elsewhere |x / scale| <= fmax already, up to float32 rounding.
- A row of zeros has scale 0 and comes back as exact zeros. A row holding an inf or a NaN has
  scale inf or NaN and comes back all NaN (its payload may be anything: 0, or NaN).

The packed row: the d payload values, then the float32 scale's 4 bytes, in one tensor of the
wire dtype whose last dimension is d + 4. The all-to-all moves a packed row as one row (the
relayout never splits d), so the fallback and the fast path move the same bytes, and a rank
whose wire dtype differs from its peers' makes a call of another dtype or shape, which the
groups' cross-rank checks refuse like any other mismatch.

Dequantize: payload (float32) * scale, rounded once to the caller's dtype. The round trip's
error per row is at most amax * 2^-4 (e4m3fn) or amax * 2^-3 (e5m2) where the scale is a
normal float32 (docs/API.md, "FP8 on the wire").

Autograd: the forward is quantized; the backward moves the gradient in the caller's dtype,
the plain reverse call (mode 1 - m on `backward_tag(tag)`): the quantizer counts as the
identity for gradients (straight-through), since FP8 gradients lose too much.
"""

from __future__ import annotations

import torch

from ._ops import ops
from .autograd import TorchAllToAll, check_borrowed_grad
from .call import OWNED, make_call
from .errors import FastUlyssesError
from .plan import cached_plan
from .tags import resolve_tag

FORMATS = (torch.float8_e4m3fn, torch.float8_e5m2)  # the wire dtypes
INPUTS = (torch.bfloat16, torch.float16, torch.float32)  # the dtypes a wire call takes
SCALE_BYTES = 4  # one float32 scale per row, after its d payload bytes


def fmax(wire_dtype: torch.dtype) -> float:
    """The largest finite value of a wire dtype (the scale rule's denominator)."""
    check_wire_dtype(wire_dtype)
    return torch.finfo(wire_dtype).max


# -- argument checks (local, before anything is sent) ------------------------------------


def check_wire_dtype(wire_dtype) -> None:
    if wire_dtype not in FORMATS:
        raise FastUlyssesError(
            f"wire_dtype={wire_dtype!r}: it must be torch.float8_e4m3fn or torch.float8_e5m2 "
            "(or None: the call moves x's own dtype)"
        )


def check_input(x, name: str = "x") -> None:
    if not isinstance(x, torch.Tensor):
        raise FastUlyssesError(f"{name} is a {type(x).__name__}: it must be a torch.Tensor")
    if x.dim() == 0 or x.shape[-1] == 0:
        raise FastUlyssesError(
            f"{name} has shape {tuple(x.shape)}: a call with wire_dtype quantizes rows of the "
            "last dimension, which must hold at least one value"
        )
    if x.dtype not in INPUTS:
        raise FastUlyssesError(
            f"{name} has dtype {x.dtype}: a call with wire_dtype takes torch.bfloat16, "
            "torch.float16 or torch.float32 (it quantizes them to the wire dtype)"
        )


def _check_call(group, x, mode, wire_dtype, dequantize, out, borrowed, barrier, kw) -> None:
    """Every rule of a wire call that the plain call on the packed tensor does not apply."""
    if type(dequantize) is not bool:
        raise FastUlyssesError(f"dequantize={dequantize!r}: it must be a bool")
    if wire_dtype is None:
        raise FastUlyssesError(
            "dequantize=False without wire_dtype: only a call with a wire_dtype has a payload "
            "and scales to return"
        )
    check_wire_dtype(wire_dtype)
    check_input(x)
    grad = x.requires_grad and torch.is_grad_enabled()
    if borrowed:
        check_borrowed_grad(x)
        if dequantize and barrier is False:
            raise FastUlyssesError(
                "barrier=False with wire_dtype and dequantize=True: the dequantize would read "
                "the window before barrier(); pass dequantize=False and dequantize after "
                "group.barrier() (fast_ulysses.wire.dequantize)"
            )
        if barrier is False and isinstance(x, torch.Tensor) and x.dim() and x.shape[-1] % 4:
            raise FastUlyssesError(
                f"barrier=False with wire_dtype and d = {x.shape[-1]}, not a multiple of 4: "
                "the scales are not 4-byte aligned in the window, so returning them means "
                "copying them out before barrier(); use barrier=True, or a d that is a "
                "multiple of 4"
            )
    if not dequantize and grad:
        raise FastUlyssesError(
            "dequantize=False with an input that requires grad: the FP8 payload records no "
            "backward; call with dequantize=True when gradients are needed"
        )
    if out is not None:
        _check_out(group, x, mode, out, dequantize, grad, kw)


def _check_out(group, x, mode, out, dequantize, grad, kw) -> None:
    if not isinstance(out, torch.Tensor):
        raise FastUlyssesError(f"out is a {type(out).__name__}: it must be a torch.Tensor")
    if not dequantize:
        raise FastUlyssesError("out= with dequantize=False: out receives the dequantized result")
    if grad:
        raise FastUlyssesError(
            "out= with an input that requires grad: out= records no backward; call without "
            "out= when gradients are needed"
        )
    if out.dtype != x.dtype or out.device != x.device or not out.is_contiguous():
        raise FastUlyssesError(
            f"out is a {out.dtype} tensor on {out.device}"
            f"{'' if out.is_contiguous() else ', not contiguous'}: with wire_dtype it must be "
            f"a contiguous {x.dtype} tensor on {x.device} (x's dtype: the dequantized result)"
        )
    shape = _output_shape(group, x, mode, kw)
    if shape is not None and tuple(out.shape) != shape:
        raise FastUlyssesError(
            f"out has shape {tuple(out.shape)}: it must have the call's output shape {shape}"
        )


def _output_shape(group, x, mode, kw) -> tuple | None:
    """The call's output shape (in x's d), or None where the plan refuses the call (the call
    itself then refuses it, on every rank)."""
    if x.dim() != 4:
        return None
    seq, heads = kw.get("seq_splits"), kw.get("head_splits")
    try:
        shape = cached_plan(
            group.world_size,
            group.rank,
            mode,
            tuple(x.shape),
            x.element_size(),
            None if seq is None else tuple(seq),
            None if heads is None else tuple(heads),
            kw.get("layout", "bshd"),
        ).output_shape
    except (ValueError, TypeError):
        return None
    return tuple(shape)


# -- the rule ------------------------------------------------------------------------------


def quantize(x: torch.Tensor, wire_dtype: torch.dtype) -> torch.Tensor:
    """x quantized and packed: a contiguous tensor of the wire dtype, x's shape but d + 4 in
    the last dimension (each row's d payload values, then its float32 scale's 4 bytes), by the
    op `fast_ulysses::wire_quantize` on the CPU (one pass: csrc/kernels/wire_rule.h), by
    `quantize_reference` on other devices: the same bytes either way.

    Raises:
        FastUlyssesError for a wire_dtype that is not an FP8 format or an x that is not a
        bf16, fp16 or fp32 tensor.
    """
    check_wire_dtype(wire_dtype)
    check_input(x)
    if _on_kernels(x):
        return ops.wire_quantize(x.detach(), wire_dtype)
    return _quantize_in_torch(x, wire_dtype)


def quantize_reference(x: torch.Tensor, wire_dtype: torch.dtype) -> torch.Tensor:
    """`quantize` in torch operations: the rule as written above, which the ops' CPU kernels
    equal bit for bit (tests/python/test_wire.py)."""
    check_wire_dtype(wire_dtype)
    check_input(x)
    return _quantize_in_torch(x, wire_dtype)


def _quantize_in_torch(x: torch.Tensor, wire_dtype: torch.dtype) -> torch.Tensor:
    """`quantize_reference` once its arguments are checked (`quantize` checks them itself)."""
    x = x.detach()
    xf = x.float()
    top = torch.finfo(wire_dtype).max
    # amax times the reciprocal, not amax / top: CUDA divides a tensor by a scalar that way, so
    # written out it rounds the same on every device (a CPU-simulated call matches the GPU's).
    scale = xf.abs().amax(dim=-1, keepdim=True) * (1.0 / top)
    payload = torch.where(scale > 0, (xf / scale).clamp(-top, top), 0.0).to(wire_dtype)
    # The scale's bytes as wire-dtype elements (flat first: an empty x's strides). One cat, not
    # slice writes into an empty tensor: inductor cannot lower those for FP8.
    scale_bytes = scale.reshape(-1).view(torch.uint8).view(wire_dtype)
    return torch.cat([payload, scale_bytes.view(*x.shape[:-1], SCALE_BYTES)], dim=-1)


def unpack(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(payload, scales) of a packed tensor: payload (..., d) in the wire dtype, a view;
    scales (...) float32, a view where d is a multiple of 4 (else a copy)."""
    if not isinstance(packed, torch.Tensor) or packed.dtype not in FORMATS:
        got = packed.dtype if isinstance(packed, torch.Tensor) else type(packed).__name__
        raise FastUlyssesError(f"packed is {got}: it must be a tensor of an FP8 wire dtype")
    if packed.shape[-1] < SCALE_BYTES:
        raise FastUlyssesError(
            f"packed has shape {tuple(packed.shape)}: its last dimension holds d + 4 values"
        )
    d = packed.shape[-1] - SCALE_BYTES
    payload = packed[..., :d]
    scale_bytes = packed.view(torch.uint8)[..., d:]
    try:
        scales = scale_bytes.view(torch.float32)
    except RuntimeError:  # rows not 4-byte aligned (d % 4 != 0): copy them out
        scales = scale_bytes.clone(memory_format=torch.contiguous_format).view(torch.float32)
    return payload, scales.squeeze(-1)


def dequantize(payload: torch.Tensor, scales: torch.Tensor, dtype=torch.float32, out=None):
    """payload * scale per row, rounded once to `dtype` (into `out` when given), in torch
    operations: the rule as written, for `unpack`'s two parts."""
    result = payload.float() * scales.unsqueeze(-1)
    if out is not None:
        return out.copy_(result)
    return result.to(dtype)


def dequantize_packed(packed: torch.Tensor, dtype=torch.float32, out=None) -> torch.Tensor:
    """`dequantize(*unpack(packed), dtype, out)`: on the CPU by the op
    `fast_ulysses::wire_dequantize` (one pass, the same values), writing a contiguous `out` of
    an input dtype directly; on other devices `dequantize` itself."""
    if not _on_kernels(packed):
        return dequantize(*unpack(packed), dtype, out)
    if out is None:
        return ops.wire_dequantize(packed, dtype)
    if out.is_contiguous() and out.dtype in INPUTS:
        return ops.wire_dequantize_out(packed, out=out)
    return out.copy_(ops.wire_dequantize(packed, torch.float32))


def _on_kernels(t: torch.Tensor) -> bool:
    """Whether `t` goes through the ops (a CPU tensor), not the torch reference (any other
    device: the ops have no CUDA kernels yet)."""
    return t.device.type == "cpu"


# -- the route of a wire call --------------------------------------------------------------


def exchange(group, x, mode, tag, *, wire_dtype, dequantize, borrowed=False, out=None, **kw):
    """A group's call with a wire dtype: quantize, the group's plain call on the packed tensor
    (owned or borrowed, the same tag), then dequantize or unpack. The groups' methods hand
    over to it when wire_dtype is given; `kw` are the call's own keywords (splits, layout,
    barrier for a borrowed call, use_tma)."""
    for name in ("seq_splits", "head_splits"):  # read once: the backward reads them again
        if kw.get(name) is not None and not isinstance(kw[name], (list, tuple)):
            kw[name] = list(kw[name])
    barrier = kw.get("barrier", True)
    _check_call(group, x, mode, wire_dtype, dequantize, out, borrowed, barrier, kw)
    packed = quantize(x, wire_dtype)
    if borrowed:
        moved = group.all_to_all_single_4d_borrowed(packed, mode, tag, **kw)
        return _receive(moved, x.dtype, dequantize, None)
    tag = resolve_tag(tag, packed, mode, kw.get("layout", "bshd"))
    if not (dequantize and out is None and x.requires_grad and torch.is_grad_enabled()):
        moved = group.all_to_all_single_4d(packed, mode, tag, **kw)
        return _receive(moved, x.dtype, dequantize, out)
    call = make_call(
        OWNED, x, mode, tag, kw.get("seq_splits"), kw.get("head_splits"), kw.get("layout", "bshd")
    )
    return TorchAllToAll.apply(  # forward quantized; backward the plain reverse call
        x,
        group,
        lambda: _receive(group.all_to_all_single_4d(packed, mode, tag, **kw), x.dtype, True),
        call,
    )


def _receive(moved, dtype, dequantize_, out=None):
    if not dequantize_:
        return unpack(moved)
    return dequantize_packed(moved, dtype, out)


def simulate(inputs, mode, wire_dtype, **kw) -> list[torch.Tensor]:
    """`fast_ulysses.simulate` with a wire dtype: every input quantized, the packed tensors
    moved by the plan, every output dequantized to its input's dtype."""
    from .simulation import simulate as plain

    if not isinstance(inputs, (list, tuple)):
        return plain(inputs, mode, **kw)  # its message for inputs that are not a sequence
    for r, x in enumerate(inputs):
        check_input(x, f"inputs[{r}]")
    packed = plain([quantize(x, wire_dtype) for x in inputs], mode, **kw)
    return [dequantize(*unpack(p), dtype=x.dtype) for p, x in zip(packed, inputs)]


class WireCalls:
    """`group` with every call on a wire dtype (UlyssesAttention's, with wire_dtype): the owned
    call with `wire_dtype`; a borrowed call goes as the owned call (the dequantized result is a
    new tensor either way, so a window would save no copy), leaving `barrier()` nothing to
    close. Everything else is the group's."""

    def __init__(self, group, wire_dtype):
        check_wire_dtype(wire_dtype)
        self._group, self._wire_dtype = group, wire_dtype

    def __getattr__(self, name):
        return getattr(self._group, name)

    def all_to_all_single_4d(self, x, mode, tag=None, **kw):
        return self._group.all_to_all_single_4d(x, mode, tag, wire_dtype=self._wire_dtype, **kw)

    def all_to_all_single_4d_borrowed(self, x, mode, tag, *, barrier=True, **kw):
        return self.all_to_all_single_4d(x, mode, tag, **kw)

    def barrier(self) -> None:
        pass
