"""FAST_ULYSSES_DEBUG=1: every rank checks every call against every other rank's, before
anything is sent. One function, `check_agreement` (both groups reach it through
`check_next_call`, which numbers their calls); and the registry of
debugged UlyssesGroups by process-group name (`debugged`), through which the fast group's
backward, which is C++, finds its group to check too (`check_backward`, the hook it calls while
a debugged group is registered)."""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
import torch.distributed as dist

from ._ops import _C
from .arguments import as_mode, check_tag
from .call import Call, describe, make_call, others
from .env import DEBUG_ENV, switch
from .errors import FastUlyssesError
from .validation import plan_call


def debug_enabled() -> bool:
    """FAST_ULYSSES_DEBUG (0|1), read when a group is built; another value raises ValueError."""
    return switch(DEBUG_ENV)


_DEBUGGED: dict = {}  # process-group name -> weakref to a live UlyssesGroup built with debug on


def register_debugged(group) -> None:
    """Records a UlyssesGroup built with FAST_ULYSSES_DEBUG=1 under its group_name, and has the
    owned op's backward call `check_backward`."""
    _DEBUGGED[group.group_name] = weakref.ref(group)
    _C.set_backward_check(check_backward)


def unregister_debugged(group) -> None:
    """Forgets `group` (its destroy()); with no debugged group left, the backward calls no hook."""
    ref = _DEBUGGED.get(group.group_name)
    if ref is not None and ref() is group:
        del _DEBUGGED[group.group_name]
    if not _DEBUGGED:
        _C.set_backward_check(None)


def debugged(group_name: str):
    """The live debugged UlyssesGroup of `group_name`, or None."""
    ref = _DEBUGGED.get(group_name)
    return ref() if ref is not None else None


def check_backward(group_name, grad, mode, tag, seq_splits, head_splits, layout) -> None:
    """The hook of the owned op's C++ backward (csrc/ops/autograd_kernels.cpp), about to send
    `grad` with its own arguments (mode 1 - m on `backward_tag(tag)`): the debugged group of
    `group_name`, if one lives, checks the call across ranks first. In eager autograd only (a
    plain tensor): a compiled backward is traced once, with no collective in the trace."""
    group = debugged(group_name)
    if group is not None and type(grad) is torch.Tensor:
        group._before_call(
            make_call(
                "all_to_all_single_4d (backward)", grad, mode, tag, seq_splits, head_splits, layout
            )
        )


def check_agreement(
    process_group,
    rank: int,
    world_size: int,
    index: int,
    call: Call,
    *,
    check_device: Callable | None = None,
) -> None:
    """Gathers every rank's call number `index` (one all_gather_object: a debugging aid, not
    for speed) and raises ValueError on every rank, naming both calls, if any rank's call is
    invalid or differs from the others'.

    Arguments:
        process_group, rank, world_size: the group's.
        index: the call's number on this group (1 for the first).
        call: the call (`fast_ulysses.call.Call`): its entry point, barrier and every field no
            check reads by name must agree too.
        check_device: the group's device rule for x (raises ValueError), or None.
    """
    shown = describe(call)
    x, layout = call.x, call.layout
    key, error = None, ""
    try:
        check_tag(call.tag)
        if check_device is not None:
            check_device(x)
        # Shapes legitimately differ across ranks with uneven splits; the resolved splits, the
        # batch and head dimensions and the window size must agree.
        p = plan_call(
            x,
            world_size,
            rank,
            call.mode,
            seq_splits=call.seq_splits,
            head_splits=call.head_splits,
            layout=layout,
        )
        key = (
            call.entry,
            as_mode(call.mode),
            call.tag,
            layout,
            str(x.dtype),
            p.seq_splits,
            p.head_splits,
            p.input_shape[layout.index("b")],
            p.input_shape[3],
            p.window_bytes,
            call.barrier,
            others(call),
        )
    except ValueError as exc:
        error = str(exc)
    gathered: list = [None] * world_size
    dist.all_gather_object(gathered, (key, shown, error), group=process_group)
    for peer, (_, peer_call, peer_error) in enumerate(gathered):
        if peer_error:
            raise FastUlyssesError(
                f"call #{index}: rank {peer} called {peer_call}, which is invalid: {peer_error}"
            )
    for peer, (peer_key, peer_call, _) in enumerate(gathered):
        if peer_key != key:
            raise FastUlyssesError(
                f"call #{index} differs across ranks: rank {rank} called {shown} "
                f"but rank {peer} called {peer_call}"
            )


def check_next_call(group, call: Call, *, check_device: Callable) -> None:
    """`check_agreement` of `group`'s next call (either group: its process_group, rank,
    world_size and call counter `_calls`, which this advances)."""
    group._calls += 1
    check_agreement(
        group.process_group,
        group.rank,
        group.world_size,
        group._calls,
        call,
        check_device=check_device,
    )
