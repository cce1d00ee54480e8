"""The bench's FP8 wire row (--wire e4m3, e5m2 or fp8 = e4m3): the copy and borrowed calls
again with `wire_dtype=` (each row quantized to FP8 with its own fp32 scale, moved packed,
dequantized to the case's dtype on arrival), on their own tags. Timed like the plain calls (ms,
host us), with one accuracy figure each: the largest absolute difference between the
dequantized result and the plain call's result on the same input (a check, not a timing), and
that difference over the input's amax.
"""

from __future__ import annotations

import argparse

import torch

from .timing import agreed_error, host_us, median_ms

FORMATS = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
ALIASES = {"fp8": "e4m3", "none": None}


def wire_option(text: str) -> str | None:
    """--wire: e4m3, e5m2, fp8 (= e4m3) or none; the format's name (None for none)."""
    name = text.lower()
    name = ALIASES.get(name, name)
    if name is not None and name not in FORMATS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: it must be e4m3, e5m2, fp8 (= e4m3) or none (e.g. fp8)"
        )
    return name


def add_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--wire",
        type=wire_option,
        default=None,
        help="also time the copy and borrowed calls with FP8 on the wire (e4m3, e5m2, "
        "fp8 = e4m3; none: no wire row) and report their largest error against the plain "
        "call's result",
    )


def _wait(t):
    return t.wait() if hasattr(t, "wait") else t


def wire_calls(fast, x, mode: int, tag: str, kw: dict, wire_dtype) -> tuple:
    """(copy, borrowed): the two entry points with `wire_dtype`, each on its own tag, each
    returning the dequantized result."""
    copy = lambda: _wait(  # noqa: E731
        fast.all_to_all_single_4d(x, mode, tag, wire_dtype=wire_dtype, **kw)
    )
    borrowed = lambda: fast.all_to_all_single_4d_borrowed(  # noqa: E731
        x, mode, tag + "-b", wire_dtype=wire_dtype, **kw
    )
    return copy, borrowed


def max_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| in float32 (0 for empty tensors)."""
    diff = (got.float() - want.float()).abs()
    return diff.max().item() if diff.numel() else 0.0


def run_wire(case, mode: int, ctx, x: torch.Tensor, plain) -> dict:
    """The wire row of one (case, mode) on this rank: `plain()` is the plain copy call on x
    (its result is the accuracy's reference). ms and host us per call for copy and borrowed,
    the largest error of each against the plain result, or the error every rank agreed on (a
    failed call: every rank skips the timing)."""
    name = ctx.wire
    out = {
        "format": name,
        "copy_ms": None,
        "borrowed_ms": None,
        "copy_host_us": None,
        "borrowed_host_us": None,
        "copy_max_abs_error": None,
        "borrowed_max_abs_error": None,
        "input_amax": None,
        "packed_bytes_in": x.numel() // x.shape[-1] * (x.shape[-1] + 4),
        "error": None,
    }
    copy, borrowed = wire_calls(
        ctx.fast, x, mode, f"{case.name}-{mode}-w", case.kwargs(), FORMATS[name]
    )
    error = None
    try:
        want = plain().clone()
        out["copy_max_abs_error"] = max_error(copy(), want)
        out["borrowed_max_abs_error"] = max_error(borrowed(), want)
        out["input_amax"] = x.float().abs().max().item() if x.numel() else 0.0
    except Exception as e:  # noqa: BLE001 - recorded in the results, not fatal to the bench
        error = f"{type(e).__name__}: {e}"
    out["error"] = agreed_error(error)
    if out["error"] is not None:
        return out
    it, wu = ctx.iters, ctx.warmup
    out["copy_ms"] = median_ms(copy, it, wu)
    out["borrowed_ms"] = median_ms(borrowed, it, wu)
    out["copy_host_us"] = host_us(copy, it)
    out["borrowed_host_us"] = host_us(borrowed, it)
    return out
