"""`simulate()`: every rank's copy plan executed on CPU memory, with the addressing the GPU
transport issues (the plan from `fast_ulysses.plan`, the copies by the C++ host executor)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._ops import ops
from .errors import FastUlyssesError, refused
from .plan import Plan, _element_size, plan


def simulate(
    inputs: Sequence[torch.Tensor],
    mode: int,
    *,
    seq_splits: Sequence[int] | None = None,
    head_splits: Sequence[int] | None = None,
    layout: str = "bshd",
    wire_dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """Runs every rank's plan on CPU memory and returns every rank's output.

    With `wire_dtype` (FP8 on the wire, `fast_ulysses.wire`): every input quantized and packed,
    the packed tensors moved, every output dequantized to its input's dtype: what the groups'
    calls with that wire_dtype return.

    `inputs[r]` is rank r's input (any device; it is copied to the CPU); `mode` is 0, 1 or a
    `Mode`. Each rank's plan is
    executed with memcpy into per-rank windows of `window_bytes`, exactly the addressing the GPU
    transport issues, and output r is read from the start of window r.

    The inputs must describe one all-to-all: every rank's the same batch, head_dim and dtype,
    and the same splits once resolved (None: even), so only the dimension that differs across
    ranks (mode 0: the sequence; mode 1: the heads) may differ, and each rank's must equal its
    split.

    Raises:
        FastUlyssesError (a ValueError) naming the argument: `inputs` that is not a sequence of
        tensors of one dtype readable on the CPU (not meta), ranks that disagree on batch,
        head_dim or the resolved splits (naming the rank and the shapes), or anything `plan`
        refuses for a rank.
    """
    if wire_dtype is not None:
        from . import wire  # (wire imports this module)

        kw = dict(seq_splits=seq_splits, head_splits=head_splits, layout=layout)
        return wire.simulate(inputs, mode, wire_dtype, **kw)
    try:
        return _simulate(inputs, mode, seq_splits, head_splits, layout)
    except ValueError as error:
        raise refused(error) from None


def _simulate(inputs, mode, seq_splits, head_splits, layout) -> list[torch.Tensor]:
    try:
        if isinstance(inputs, (torch.Tensor, str, bytes)):
            raise TypeError
        inputs = list(inputs)
    except TypeError:
        raise FastUlyssesError(
            f"inputs is a {type(inputs).__name__}: it must be a sequence of tensors, one per rank"
        ) from None
    world_size = len(inputs)
    if world_size == 0:
        raise FastUlyssesError("inputs is empty: pass one tensor per rank")
    for r, x in enumerate(inputs):
        if not isinstance(x, torch.Tensor):
            raise FastUlyssesError(
                f"inputs[{r}] is a {type(x).__name__}: it must be a torch.Tensor, one per rank"
            )
    dtype = inputs[0].dtype
    for r, x in enumerate(inputs):
        if x.dtype != dtype:
            raise FastUlyssesError(
                f"inputs[{r}] has dtype {x.dtype} but inputs[0] has {dtype}: "
                "every rank must pass the same dtype"
            )
    _element_size(dtype, f"inputs[0] has dtype {dtype}")  # (plan() would name dtype=)
    host = [_on_cpu(x, f"inputs[{r}]") for r, x in enumerate(inputs)]
    plans = [
        plan(
            world_size,
            r,
            mode,
            x.shape,
            dtype,
            seq_splits=seq_splits,
            head_splits=head_splits,
            layout=layout,
        )
        for r, x in enumerate(host)
    ]
    _check_ranks_agree(host, plans)
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


def _on_cpu(x: torch.Tensor, name: str) -> torch.Tensor:
    """x's data as a contiguous CPU tensor, or FastUlyssesError naming `name` where it has none
    to read (a meta tensor)."""
    if x.device.type != "meta":
        try:
            return x.detach().to("cpu").contiguous()
        except NotImplementedError:
            pass
    raise FastUlyssesError(
        f"{name} is on device {x.device}: simulate reads the data, so every input must be on "
        "a device that can copy it to the CPU (not meta)"
    )


def _check_ranks_agree(host: list[torch.Tensor], plans: list[Plan]) -> None:
    """Refuses ranks whose calls are not one all-to-all, which no rank's plan can see alone:
    they must agree on batch and head_dim and on the resolved splits (each rank's plan has
    checked its own dimension against its split). Otherwise a window would be read where no
    rank wrote.

    Raises:
        FastUlyssesError naming the rank, both shapes and the rule.
    """
    first, p0 = host[0].shape, plans[0]
    batch, varying = p0.layout.index("b"), p0.layout.index("s" if p0.mode == 0 else "h")
    only = (
        f"only dim {varying} ({'sequence' if p0.mode == 0 else 'heads'}) may differ in mode "
        f"{p0.mode}, {p0.layout}"
    )
    for r in range(1, len(host)):
        shape, p = host[r].shape, plans[r]
        if shape[batch] != first[batch] or shape[3] != first[3]:
            rule = f"ranks must agree on batch (dim {batch}) and head_dim (dim 3); {only}"
        elif (p.seq_splits, p.head_splits) != (p0.seq_splits, p0.head_splits):
            rule = (
                f"they resolve seq_splits={p.seq_splits}, head_splits={p.head_splits} but "
                f"inputs[0] resolves {p0.seq_splits}, {p0.head_splits}: ranks must agree on "
                f"the splits (None means even: pass the splits for uneven ones); {only}"
            )
        else:
            continue
        raise FastUlyssesError(
            f"inputs[{r}] has shape {list(shape)} but inputs[0] has {list(first)}: {rule}"
        )


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
