"""Checks shared by every group implementation: the input tensor's rules, the borrowed entry
points' `barrier`, and the declared calls of `reserve`.

Shapes and splits are never checked here: that is the plan's job (`fast_ulysses.plan`), so the
fast group, the torch fallback and the GPU-free tools raise the same ValueError for the same call.
The tensor rules live in C++ (`fast_ulysses._C.check_input`, the check the fast group's
kernels run), so a bad tensor reads the same whichever group rejected it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from ._ops import _C
from .arguments import check_tag
from .errors import FastUlyssesError
from .plan import Plan, plan, resolve_dtype


def check_input(x: torch.Tensor) -> int:
    """Checks the rules every all-to-all input obeys, before anything is sent.

    Arguments:
        x: this rank's input.

    Returns:
        Its element size in bytes (1, 2 or 4).

    Raises:
        ValueError if x is not a 4-d contiguous tensor of a 1-, 2- or 4-byte, non-bool,
        non-complex dtype (the device rule is each group's own).
    """
    if not isinstance(x, torch.Tensor):
        raise FastUlyssesError(f"x is a {type(x).__name__}: it must be a torch.Tensor")
    return _C.check_input(x)


def check_barrier(barrier) -> None:
    """The borrowed entry points' `barrier`: True or False (a bool; None, 0 or "no" would be
    read as one or the other without saying so).

    Raises:
        FastUlyssesError naming the value.
    """
    if type(barrier) is not bool:
        raise FastUlyssesError(f"barrier is {barrier!r}: it must be True or False")


@torch.compiler.disable  # host-side planning: its ops take no tensors, so it stays out of traces
def plan_call(
    x: torch.Tensor,
    world_size: int,
    rank: int,
    mode: int,
    *,
    seq_splits=None,
    head_splits=None,
    layout: str = "bshd",
) -> Plan:
    """Checks one call of this rank and returns its plan (resolved splits, output shape).

    Arguments:
        x: this rank's input tensor.
        world_size, rank: the group's size and this rank.
        mode, seq_splits, head_splits, layout: as for `all_to_all_single_4d`.

    Returns:
        The `Plan` of this rank for the call.

    Raises:
        ValueError from `check_input` or from the plan, with the plan's message.
    """
    element_size = check_input(x)  # (plan() takes the element size as it is)
    return plan(
        world_size,
        rank,
        mode,
        tuple(x.shape),
        element_size,
        seq_splits=seq_splits,
        head_splits=head_splits,
        layout=layout,
    )


@dataclass(frozen=True)
class CallSpec:
    """One call a process will make, declared ahead for `group.reserve` (which takes a dict
    with these field names as keys too: `as_call_spec`).

    Arguments:
        shape: this rank's input shape, in `layout` order.
        dtype: the input's torch dtype, or its name as `fast_ulysses.plan` takes it ("bf16").
        mode: 0 / Mode.SEQ_TO_HEAD (sequence -> heads) or 1 / Mode.HEAD_TO_SEQ (the inverse).
        tag: the window the call uses, a non-empty str; calls with one tag share one window.
        seq_splits, head_splits: per-rank rows / heads, None for even.
        layout: "bshd", "sbhd" or "bhsd".
    """

    shape: tuple
    dtype: torch.dtype | str
    mode: int
    tag: str
    seq_splits: tuple | None = None
    head_splits: tuple | None = None
    layout: str = "bshd"


# The keys of a call declared as a dict: CallSpec's fields, the first four required.
CALL_KEYS = ("tag", "shape", "mode", "dtype")
OPTIONAL_CALL_KEYS = ("seq_splits", "head_splits", "layout")


def as_call_spec(call, index: int) -> CallSpec:
    """`calls[index]` of `reserve` as a CallSpec: a CallSpec itself, or a dict (any mapping)
    with CallSpec's field names as keys, CALL_KEYS required and OPTIONAL_CALL_KEYS optional.

    Raises:
        FastUlyssesError naming calls[index] for anything else, and for a dict with an unknown
        or a missing key (naming the key).
    """
    if isinstance(call, CallSpec):
        return call
    if isinstance(call, Mapping):
        accepted = CALL_KEYS + OPTIONAL_CALL_KEYS
        for key in call:
            if key not in accepted:
                raise FastUlyssesError(
                    f"calls[{index}] has the unknown key {key!r}: a call dict "
                    f"takes {', '.join(accepted)}"
                )
        for key in CALL_KEYS:
            if key not in call:
                raise FastUlyssesError(
                    f"calls[{index}] has no key {key!r}: a call dict needs "
                    f"{', '.join(CALL_KEYS)} (and may have "
                    f"{', '.join(OPTIONAL_CALL_KEYS)})"
                )
        return CallSpec(**call)
    raise FastUlyssesError(
        f"calls[{index}] is a {type(call).__name__}: reserve takes "
        f"fast_ulysses.CallSpec values, or dicts with the keys "
        f"{', '.join(CALL_KEYS)} (and optionally "
        f"{', '.join(OPTIONAL_CALL_KEYS)})"
    )


def window_bytes_by_tag(
    calls: Iterable[CallSpec | Mapping], world_size: int, rank: int
) -> dict[str, int]:
    """The window every declared tag needs: the largest `window_bytes` of its calls.

    Arguments:
        calls: the declared calls: an iterable of `CallSpec`, or of dicts with its field names
            as keys (`as_call_spec`).
        world_size, rank: the group's size and this rank.

    Returns:
        {tag: bytes}, tags in the order they first appear.

    Raises:
        FastUlyssesError for `calls` that is not an iterable (a single CallSpec or dict is not
        one); naming the call (by position) that is neither a CallSpec nor such a dict, has an
        unknown or missing key, a bad tag, a shape that is not a sequence, a dtype whose
        element size the ops reject, or that the plan rejects.
    """
    sizes: dict[str, int] = {}
    for index, call in enumerate(_declared(calls)):
        call = as_call_spec(call, index)
        try:
            check_tag(call.tag)
        except ValueError as error:
            raise FastUlyssesError(f"calls[{index}]: {error}") from error
        try:
            shape = tuple(call.shape)
        except TypeError:
            raise FastUlyssesError(
                f"calls[{index}] (tag {call.tag!r}): shape is {call.shape!r}: it must be a "
                "sequence of 4 ints, this rank's input shape"
            ) from None
        try:
            dtype = resolve_dtype(call.dtype)
            p = plan(
                world_size,
                rank,
                call.mode,
                shape,
                dtype,
                seq_splits=call.seq_splits,
                head_splits=call.head_splits,
                layout=call.layout,
            )
        except (ValueError, TypeError) as error:
            raise FastUlyssesError(f"calls[{index}] (tag {call.tag!r}): {error}") from error
        sizes[call.tag] = max(sizes.get(call.tag, 0), p.window_bytes)
    return sizes


def _declared(calls):
    """An iterator over `reserve`'s calls; FastUlyssesError for anything but an iterable of
    them (a single CallSpec or dict, a str, None, a number)."""
    if not isinstance(calls, (CallSpec, Mapping, str, bytes)):
        try:
            return iter(calls)
        except TypeError:
            pass
    raise FastUlyssesError(
        f"calls is {calls!r}: it must be a list of fast_ulysses.CallSpec (or of dicts with its "
        "field names as keys), one per call"
    )
