"""GPU-free access to the copy plan: `plan()` (and, in `simulation`, `simulate()`).

Both call the C++ plan (csrc/plan) through `torch.ops.fast_ulysses.plan`, so the addressing,
defaults and error messages are exactly those the GPU path uses.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from ._ints import as_int, as_ints
from ._ops import _C, ops
from .arguments import as_mode, as_splits
from .errors import FastUlyssesError, refused

# Every layout name the plan takes, from the plan (csrc/plan/plan.h): bshd, sbhd, bhsd.
LAYOUTS = _C.LAYOUTS


def input_shape(
    world_size: int,
    rank: int,
    mode: int,
    *,
    batch: int,
    head_dim: int,
    seq_splits: Sequence[int],
    head_splits: Sequence[int],
    layout: str = "bshd",
) -> tuple[int, ...]:
    """Rank `rank`'s input shape, in `layout` order, for a call with these explicit splits:
    the plan's own (csrc/plan), the one place a rank's shape is computed. Mode as for `plan`.

    Raises:
        FastUlyssesError (a ValueError) naming the argument: an integer argument or split that
        is not an int64-sized int (a float, a bool, 2**63), splits left None, or the plan's
        message for a call it rejects.
    """
    try:
        world_size, rank = as_int(world_size, "world_size"), as_int(rank, "rank")
        mode = _mode(mode)
        batch, head_dim = as_int(batch, "batch"), as_int(head_dim, "head_dim")
        splits = [as_splits(seq_splits, "seq_splits"), as_splits(head_splits, "head_splits")]
        for values, name in zip(splits, ("seq_splits", "head_splits")):
            if values is None:
                raise FastUlyssesError(
                    f"{name} is None: input_shape takes explicit splits, one "
                    "per rank (e.g. fast_ulysses.presets.even_splits)"
                )
        shape, _ = _C.shapes(world_size, rank, mode, batch, head_dim, *splits, _layout(layout))
    except ValueError as error:
        raise refused(error) from None
    return tuple(shape)


def _mode(mode) -> int:
    """`mode` as the plan's int: `as_mode`'s rule, then int64 (the plan checks 0 or 1)."""
    if type(mode) is int and 0 <= mode <= 1:  # (the per-call case)
        return mode
    return as_int(as_mode(mode), "mode")


def _layout(layout) -> str:
    """`layout` when it is a str (the plan checks its value)."""
    if type(layout) is not str:
        names = ", ".join(repr(name) for name in LAYOUTS[:-1]) + f" or {LAYOUTS[-1]!r}"
        raise FastUlyssesError(f"layout is {layout!r}: it must be a str, {names}")
    return layout


def check_mode_and_layout(mode, layout) -> tuple[int, str]:
    """`mode` as the plan's int and `layout`, checked by the plan's own rules and messages
    (csrc/plan): for code that names a call without planning it (`tags.auto_tag`).

    Raises:
        FastUlyssesError naming mode (not an int, not 0 or 1) or layout (not one of LAYOUTS).
    """
    try:
        mode, layout = _mode(mode), _layout(layout)
        _C.shapes(1, 0, mode, 1, 1, [1], [1], layout)  # the plan's mode and layout rules
    except ValueError as error:
        raise refused(error) from None
    return mode, layout


def limits() -> dict[str, int]:
    """The product's limits, read from their one definition (csrc/plan/plan.h) as
    `_C.LIMITS`: max_world_size (ranks of one group), max_bytes (of one tensor),
    copy_engine_alignment (rows, pitches and addresses that are multiples of it take the
    pitched copy-engine calls; others an SM copy kernel: a speed note, never a refusal) and
    max_tags (distinct tags one group may use, csrc/plan/tag_rules.h)."""
    return dict(_C.LIMITS)


# The dtype names plan() and CallSpec take besides a torch.dtype: short and torch spellings.
DTYPE_NAMES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
    "half": torch.float16,
    "fp32": torch.float32,
    "float32": torch.float32,
    "float": torch.float32,
    "fp8_e4m3": torch.float8_e4m3fn,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "float8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int16": torch.int16,
    "int32": torch.int32,
}


def resolve_dtype(dtype) -> torch.dtype:
    """A torch.dtype, or one of DTYPE_NAMES, as a torch.dtype.

    Raises:
        ValueError naming the accepted names for an unknown string, or for anything else that
        is not a torch.dtype.
    """
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    raise FastUlyssesError(
        f"dtype is {dtype!r}: it must be a torch.dtype or one of {', '.join(sorted(DTYPE_NAMES))}"
    )


@dataclass(frozen=True)
class CopyDescriptor:
    """One 3D pitched copy into `peer`'s window, all in bytes: for z < depth, y < height, copy
    `width` bytes from src + src_offset + z*src_slice_pitch + y*src_pitch to
    window + dst_offset + z*dst_slice_pitch + y*dst_pitch."""

    peer: int
    src_offset: int
    dst_offset: int
    width: int
    height: int
    depth: int
    src_pitch: int
    dst_pitch: int
    src_slice_pitch: int
    dst_slice_pitch: int

    @property
    def bytes(self) -> int:
        return self.width * self.height * self.depth

    def as_list(self) -> list[int]:
        return [getattr(self, f.name) for f in fields(self)]


class Plan(list):
    """The descriptors of one rank (a list, rank order, self included) plus what the plan knows
    about the call: shapes, resolved splits and the window bytes every rank reserves."""

    def __init__(
        self,
        descriptors,
        *,
        world_size,
        rank,
        mode,
        layout,
        input_shape,
        output_shape,
        seq_splits,
        head_splits,
        window_bytes,
        element_size,
    ):
        super().__init__(descriptors)
        self.world_size = world_size
        self.rank = rank
        self.mode = mode
        self.layout = layout
        self.input_shape = tuple(input_shape)
        self.output_shape = tuple(output_shape)
        self.seq_splits = list(seq_splits)
        self.head_splits = list(head_splits)
        self.window_bytes = window_bytes
        self.element_size = element_size

    @property
    def total_bytes(self) -> int:
        return sum(d.bytes for d in self)

    @property
    def remote_bytes(self) -> int:
        return sum(d.bytes for d in self if d.peer != self.rank)


def _element_size(dtype, argument: str | None = None) -> int:
    """The element size of `dtype` (a torch.dtype, a name or a size in bytes) under the groups'
    dtype rule. A refusal names `argument` (default: "dtype=<the dtype as torch spells it>", the
    argument the caller passed) and the rule, not the `x` of the groups' tensor check."""
    if type(dtype) is int or (hasattr(dtype, "__index__") and not isinstance(dtype, bool)):
        return as_int(dtype, "dtype")  # an element size in bytes (the plan checks 1, 2 or 4)
    if isinstance(dtype, float):
        raise FastUlyssesError(
            f"dtype is {dtype!r}: an element size must be an int (e.g. "
            "2), or give a torch.dtype or a name such as 'bf16'"
        )
    # The groups' own dtype rule (`_C.check_input`), on a Meta tensor: the same message for a
    # dtype the groups refuse (bool, complex, 8 bytes), not only for its byte count.
    resolved = resolve_dtype(dtype)
    meta = torch.empty((1, 1, 1, 1), dtype=resolved, device="meta")
    try:
        return _C.check_input(meta)
    except ValueError as error:  # "x has dtype Double of 8 bytes: <rule>"
        rule = str(error).partition(": ")[2] or str(error)
        size = f" ({resolved.itemsize}-byte elements)" if "element size" in rule else ""
        raise FastUlyssesError(f"{argument or f'dtype={resolved}'}{size}: {rule}") from None


def plan(
    world_size: int,
    rank: int,
    mode: int,
    shape: Sequence[int],
    dtype,
    *,
    seq_splits: Sequence[int] | None = None,
    head_splits: Sequence[int] | None = None,
    layout: str = "bshd",
) -> Plan:
    """The copy plan of rank `rank` for one all-to-all.

    Arguments:
        world_size: ranks in the group (1..8).
        rank: this rank.
        mode: 0 / Mode.SEQ_TO_HEAD (b, s_local, N, d) -> (b, S, h_local, d); 1 /
            Mode.HEAD_TO_SEQ the inverse (bshd; sbhd swaps b and s, bhsd holds
            (b, heads, seq, d)).
        shape: this rank's input shape, in `layout` order.
        dtype: a torch dtype, a name from DTYPE_NAMES ("bf16", "float8_e4m3fn", ...), or an
            element size in bytes.
        seq_splits, head_splits: per-rank rows / heads; None means even.
        layout: "bshd", "sbhd" or "bhsd".

    Returns:
        A `Plan`: a list of `CopyDescriptor`, one per peer in rank order.

    Raises:
        FastUlyssesError (a ValueError) naming the argument, the value and the rule it breaks:
        world_size, rank, mode, the shape's entries, an element size and the splits must be
        int64-sized ints (not floats, bools or 2**63), then the plan's rules.
    """
    try:
        world_size, rank = as_int(world_size, "world_size"), as_int(rank, "rank")
        mode = _mode(mode)
        shape = as_ints(shape, "shape")
        element_size = _element_size(dtype)
        rows, output_shape, seq, heads, window_bytes = ops.plan(
            world_size,
            rank,
            mode,
            shape,
            element_size,
            as_splits(seq_splits, "seq_splits"),
            as_splits(head_splits, "head_splits"),
            _layout(layout),
        )
    except ValueError as error:
        raise refused(error) from None
    columns = _C.DESCRIPTOR_FIELDS  # the C++ column order, by name
    descriptors = [CopyDescriptor(**dict(zip(columns, row))) for row in rows.tolist()]
    return Plan(
        descriptors,
        world_size=world_size,
        rank=rank,
        mode=mode,
        layout=layout,
        input_shape=shape,
        output_shape=output_shape,
        seq_splits=seq,
        head_splits=heads,
        window_bytes=window_bytes,
        element_size=element_size,
    )


@functools.lru_cache(maxsize=256)
def cached_plan(world_size, rank, mode, shape, element_size, seq, heads, layout) -> Plan:
    """`plan` of one call, remembered: for the modules that plan a call on the host before
    issuing it (UlyssesAttention's head groups, the fused q-and-k call's check of k), every
    argument hashable (tuples or None for shape and the splits). A refused call is not
    remembered: it raises `plan`'s FastUlyssesError each time. Treat the result as read-only.
    """
    return plan(
        world_size,
        rank,
        mode,
        shape,
        element_size,
        seq_splits=seq,
        head_splits=heads,
        layout=layout,
    )
