"""GPU-free access to the copy plan: `plan()` and `simulate()`.

Both call the C++ plan (csrc/plan) through `torch.ops.fast_ulysses.plan`, so the addressing,
defaults and error messages are exactly those the GPU path uses.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

import torch

from ._ops import ops
from .api import as_mode, as_splits
from .errors import FastUlyssesError

# Every layout name the plan takes, from the plan (csrc/plan/plan.h): bshd, sbhd, bhsd.
LAYOUTS = tuple(ops.layouts())


def input_shape(world_size: int, rank: int, mode: int, *, batch: int, head_dim: int,
                seq_splits: Sequence[int], head_splits: Sequence[int],
                layout: str = "bshd") -> tuple[int, ...]:
    """Rank `rank`'s input shape, in `layout` order, for a call with these explicit splits:
    the plan's own (csrc/plan), the one place a rank's shape is computed. Mode as for `plan`.

    Raises:
        ValueError with the plan's message for a call it rejects.
    """
    shape, _ = ops.shapes(world_size, rank, as_mode(mode), batch, head_dim,
                          list(seq_splits), list(head_splits), layout)
    return tuple(shape)


def limits() -> dict[str, int]:
    """The product's limits, read from their one definition (csrc/plan/plan.h) through the
    `limits` op: max_world_size (ranks of one group), max_bytes (of one tensor),
    copy_engine_alignment (rows, pitches and addresses that are multiples of it take the
    pitched copy-engine calls; others an SM copy kernel: a speed note, never a refusal) and
    max_tags (distinct tags one group may use, csrc/plan/tag_rules.h)."""
    names, values = ops.limits()
    return dict(zip(names, values))

# The dtype names plan() and CallSpec take besides a torch.dtype: short and torch spellings.
DTYPE_NAMES = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp8_e4m3": torch.float8_e4m3fn, "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2, "float8_e5m2": torch.float8_e5m2,
    "int8": torch.int8, "uint8": torch.uint8, "int16": torch.int16, "int32": torch.int32,
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
    raise FastUlyssesError(f"dtype is {dtype!r}: it must be a torch.dtype or one of "
                     f"{', '.join(sorted(DTYPE_NAMES))}")


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

    def __init__(self, descriptors, *, world_size, rank, mode, layout, input_shape,
                 output_shape, seq_splits, head_splits, window_bytes, element_size):
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


def _element_size(dtype) -> int:
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        return dtype
    # The groups' own dtype rule (the check_input op), on a Meta tensor: the same message for a
    # dtype the groups refuse (bool, complex, 8 bytes), not only for its byte count.
    meta = torch.empty((1, 1, 1, 1), dtype=resolve_dtype(dtype), device="meta")
    return ops.check_input(meta)


def plan(world_size: int, rank: int, mode: int, shape: Sequence[int], dtype, *,
         seq_splits: Sequence[int] | None = None, head_splits: Sequence[int] | None = None,
         layout: str = "bshd") -> Plan:
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
        ValueError naming the argument, the value and the rule it breaks.
    """
    mode = as_mode(mode)
    element_size = _element_size(dtype)
    rows, output_shape, seq, heads, window_bytes = ops.plan(
        world_size, rank, mode, list(shape), element_size,
        as_splits(seq_splits, "seq_splits"), as_splits(head_splits, "head_splits"), layout)
    columns = ops.descriptor_fields()  # the C++ column order, by name
    descriptors = [CopyDescriptor(**dict(zip(columns, row))) for row in rows.tolist()]
    return Plan(descriptors, world_size=world_size, rank=rank, mode=mode, layout=layout,
                input_shape=shape, output_shape=output_shape, seq_splits=seq,
                head_splits=heads, window_bytes=window_bytes, element_size=element_size)


def simulate(inputs: Sequence[torch.Tensor], mode: int, *,
             seq_splits: Sequence[int] | None = None, head_splits: Sequence[int] | None = None,
             layout: str = "bshd") -> list[torch.Tensor]:
    """Runs every rank's plan on CPU memory and returns every rank's output.

    `inputs[r]` is rank r's input (any device; it is copied to the CPU); `mode` is 0, 1 or a
    `Mode`. Each rank's plan is
    executed with memcpy into per-rank windows of `window_bytes`, exactly the addressing the GPU
    transport issues, and output r is read from the start of window r.
    """
    world_size = len(inputs)
    if world_size == 0:
        raise FastUlyssesError("inputs is empty: pass one tensor per rank")
    dtype = inputs[0].dtype
    for r, x in enumerate(inputs):
        if x.dtype != dtype:
            raise FastUlyssesError(f"inputs[{r}] has dtype {x.dtype} but inputs[0] has {dtype}: "
                             "every rank must pass the same dtype")
    host = [x.detach().to("cpu").contiguous() for x in inputs]
    plans = [plan(world_size, r, mode, x.shape, dtype, seq_splits=seq_splits,
                  head_splits=head_splits, layout=layout) for r, x in enumerate(host)]
    # Every rank's window must be the same size: a rank-dependent input breaks that only when the
    # ranks disagree about the call, which the plan cannot see from one rank.
    sizes = {p.window_bytes for p in plans}
    if len(sizes) != 1:
        raise FastUlyssesError(f"ranks disagree on the window size ({sorted(sizes)} bytes): their "
                         "shapes and splits do not describe one all-to-all")
    windows = [torch.empty(plans[0].window_bytes, dtype=torch.uint8) for _ in range(world_size)]
    for r, p in enumerate(plans):
        src = host[r].view(-1).view(torch.uint8)
        for d in p:
            ops.host_copy(src, windows[d.peer], d.as_list())
    outputs = []
    for j, p in enumerate(plans):
        nbytes = _element_size(dtype) * _numel(p.output_shape)
        outputs.append(windows[j][:nbytes].view(dtype).view(p.output_shape).clone())
    return outputs


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
