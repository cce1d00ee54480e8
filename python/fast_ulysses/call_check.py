"""The fallback's call check: before any data moves, every call of `TorchUlyssesGroup` at P > 1
goes ahead only if every rank of the group makes the same call.

A row. Each rank sends one int64 row (`CallCheck.agree`: one `all_gather_into_tensor`) saying
what it believes the call is: 0 (a valid call), the entry point, mode, layout, tag (a 64-bit
hash), dtype and x's device type (codes), batch, head_dim, the plan's window bytes and barrier
(-1 for the owned entry), a 64-bit hash of every other field of the call
(`fast_ulysses.call.others`: 0 when there is none, so a field added to `Call` is compared without
this check being edited), then the plan's resolved seq_splits and head_splits (P values each). A
rank that refuses its own call (a plan error, a tag rule, a device its group does not move, a
bad out=) sends the invalid row (1, then zeros) instead, so it still joins the gather. The row
travels on the CPU where the group's backend takes CPU tensors (gloo), else on x's GPU (NCCL),
where reading it back makes the host wait for the gather.

When a call is refused: where some row is invalid or the rows differ, every rank raises. Where
every rank refused its own call, each raises its own refusal as it is (the message a one-rank
group gives). Else every rank raises the same `FastUlyssesError`, after a second gather (of text,
on this error path only) that names the calls: the invalid ones (with a valid one beside them), or
rank 0's call and the first that differs from it, and how. A program whose ranks disagree (uneven
sequence lengths without seq_splits, head_splits on one rank only, another mode, tag or layout)
would otherwise abort in the transport or receive memory no rank wrote; one whose ranks hold x
on different device types (one on meta, which the group refuses, or cpu against cuda) would
leave some ranks waiting in the transport.

The switches. Building the group is collective at P > 1: FAST_ULYSSES_DEBUG and
FAST_ULYSSES_CHECK_CALLS must parse and agree on every rank (`agreed_settings`).
FAST_ULYSSES_CHECK_CALLS=0 turns the check off; with FAST_ULYSSES_DEBUG=1 the debug check
(`fast_ulysses.debug.check_agreement`: an all_gather_object of every call, which also names it)
runs instead.
"""

from __future__ import annotations

import hashlib
import zlib
from functools import cache, lru_cache

import torch
import torch.distributed as dist

from .call import BORROWED, OWNED, describe, others
from .debug import debug_enabled
from .env import CHECK_CALLS_ENV, switch
from .errors import FastUlyssesError
from .plan import LAYOUTS, Plan
from .topology import _rank_list, agreement_message


def agreed_settings(process_group, world_size: int) -> tuple[bool, bool]:
    """This rank's (FAST_ULYSSES_DEBUG, FAST_ULYSSES_CHECK_CALLS), once every rank has shown
    that both parse and agree: one all_gather_object at P > 1. Either switch set on some ranks
    only would make their calls wait in a collective the others never join; a value refused on
    one rank would leave the others waiting here. Either way every rank raises the same
    FastUlyssesError (`topology.agreement_message` for the debug switch and refused values)."""
    debug, check, error = False, True, ""
    try:
        debug = debug_enabled()
        check = switch(CHECK_CALLS_ENV)
    except ValueError as refusal:
        error = str(refusal)
    everyone = [(debug, check, error)]
    if world_size > 1:
        everyone = [None] * world_size
        dist.all_gather_object(everyone, (debug, check, error), group=process_group)
    message = agreement_message(
        [d for d, _, _ in everyone], [e for _, _, e in everyone]
    ) or _check_calls_message([c for _, c, _ in everyone])
    if message:
        raise FastUlyssesError(message)
    return debug, check


def _check_calls_message(check: list[bool]) -> str:
    """The error for FAST_ULYSSES_CHECK_CALLS=0 on some ranks only; "" when every rank agrees."""
    off = [r for r, on in enumerate(check) if not on]
    if not off or len(off) == len(check):
        return ""
    on = [r for r, flag in enumerate(check) if flag]
    return (
        f"{CHECK_CALLS_ENV}=0 on {_rank_list(off)} but not on {_rank_list(on)}: set it the "
        f"same on every rank (with it on, each call of the group first compares every "
        f"rank's call in a collective, which ranks with it off never join)"
    )


class CallCheck:
    """The call check of one group at P > 1 (the module's docstring says what it compares): its
    gather buffers, by device, which every call reuses.

    Arguments:
        process_group: the group's ranks.
        world_size: the group's size.
    """

    def __init__(self, process_group, world_size: int):
        self.process_group = process_group
        self.world_size = world_size
        self._row_size = len(_HEADER) + 2 * world_size
        self._invalid_row = [1] + [0] * (self._row_size - 1)
        self._rows: dict[torch.device, torch.Tensor] = {}  # gather buffers, by device
        self._gather_type = _gather_device_type(process_group)

    def agree(self, index, prepare, call):
        """Checks one call of the group across its ranks (collective): `prepare()`, then one
        all_gather_into_tensor of every rank's `_row` (or of the invalid row, where `prepare`
        raised: this rank still joins).

        Arguments:
            index: the call's number in the group, for the message.
            prepare: this rank's own checks of the call, with no effect on the group: returns
                (tag, plan, ...), or raises.
            call: the call as made (`fast_ulysses.call.Call`; entry OWNED or BORROWED).

        Returns:
            `prepare`'s result, when every row is the same valid row.

        Raises:
            On every rank, where some row is invalid or the rows differ (`_refuse`): this
            rank's own refusal where every rank refused its call; else FastUlyssesError.
        """
        prepared, mine = None, None
        try:
            prepared = prepare()
            row = _row(call, prepared[1], prepared[0])
        except Exception as error:  # noqa: BLE001 - every rank must learn of it, then raise
            row, mine = self._invalid_row, error
        x = call.x
        if isinstance(x, torch.Tensor) and x.device.type == self._gather_type:
            device = x.device
        else:
            device = _default_device(self._gather_type)
        rows = self._rows.get(device)
        if rows is None:
            rows = self._rows[device] = torch.empty(
                self.world_size * self._row_size, dtype=torch.int64, device=device
            )
        dist.all_gather_into_tensor(
            rows, torch.tensor(row, dtype=torch.int64, device=device), group=self.process_group
        )
        everyone = rows.view(self.world_size, self._row_size).tolist()
        first = everyone[0]
        if first[0] or any(other != first for other in everyone[1:]):
            shown = describe(call if prepared is None else call._replace(tag=prepared[0]))
            if not row[0] and len({peer[_DEVICE] for peer in everyone if not peer[0]}) > 1:
                shown = f"{shown} on {x.device.type}"  # valid calls on different device types
            none = (call.seq_splits is None, call.head_splits is None)
            self._refuse(index, everyone, shown, mine, *none)
        return prepared

    def _refuse(self, index, rows, call, mine, seq_none, head_none):
        """The call check's error path (every rank takes it, seeing the same rows). Where every
        rank refused its own call, each raises its own refusal as it is (the message a
        one-rank group gives; no rank is left waiting). Else every rank gathers every rank's
        call as text and raises FastUlyssesError with the same message, naming the calls."""
        if all(row[0] for row in rows):
            raise mine
        error = "" if mine is None else (str(mine) or type(mine).__name__)
        calls = [None] * self.world_size
        dist.all_gather_object(calls, (call, error, seq_none, head_none), group=self.process_group)
        raise FastUlyssesError(_refusal(index, rows, calls)) from mine


# -- the call check's row ----------------------------------------------------------------------

# The row's fixed fields; the plan's resolved seq_splits and head_splits (P each) follow.
_HEADER = (
    "invalid",
    "entry point",
    "mode",
    "layout",
    "tag",
    "dtype",
    "device",
    "batch",
    "head_dim",
    "window bytes",
    "barrier",
    "other arguments",
)
_DEVICE, _WINDOW, _BARRIER, _OTHERS = (
    _HEADER.index(f) for f in ("device", "window bytes", "barrier", "other arguments")
)
_ENTRY_CODES = {OWNED: 0, BORROWED: 1}
_LAYOUT_CODES = {name: code for code, name in enumerate(LAYOUTS)}
_SHOWN = {"mode", "batch", "head_dim"}  # told by value (the others: by the calls)


@lru_cache(maxsize=4096)
def _tag_code(tag: str) -> int:
    """A 64-bit hash of `tag`, the same in every process (Python's hash() of a str is not)."""
    digest = hashlib.blake2b(tag.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


@cache
def _dtype_code(dtype: torch.dtype) -> int:
    return zlib.crc32(str(dtype).encode())


@cache
def _device_code(device_type: str) -> int:
    return zlib.crc32(device_type.encode())


def _row(call, p: Plan, tag: str) -> list[int]:
    """What this rank believes `call` is, as the call check compares it (`tag`: resolved)."""
    shape, x, barrier = p.input_shape, call.x, call.barrier
    extra = others(call)
    return [
        0,
        _ENTRY_CODES[call.entry],
        p.mode,
        _LAYOUT_CODES[p.layout],
        _tag_code(tag),
        _dtype_code(x.dtype),
        _device_code(x.device.type),
        shape[p.layout.index("b")],
        shape[3],
        p.window_bytes,
        -1 if barrier is None else int(barrier),
        _tag_code(repr(extra)) if extra else 0,
        *p.seq_splits,
        *p.head_splits,
    ]


def _refusal(index: int, rows: list[list[int]], calls: list[tuple]) -> str:
    """The call check's message, the same on every rank: the invalid calls (with a valid one
    beside them), or rank 0's call and the first that differs from it, and how."""
    errors = [error for _, error, _, _ in calls]
    bad = [r for r, error in enumerate(errors) if error]
    if bad:
        alike: dict[tuple[str, str], list[int]] = {}
        for r in bad:
            alike.setdefault(calls[r][:2], []).append(r)
        parts = [
            f"{_rank_list(ranks)} called {call}, which is invalid: {error}"
            for (call, error), ranks in alike.items()
        ]
        good = [r for r, error in enumerate(errors) if not error]
        if good:
            parts.append(f"rank {good[0]} called {calls[good[0]][0]}")
        return f"call #{index} was refused on every rank: " + "; ".join(parts)
    peer = next(r for r in range(1, len(rows)) if rows[r] != rows[0])
    return (
        f"call #{index} differs across ranks: rank 0 called {calls[0][0]} but rank {peer} "
        f"called {calls[peer][0]}: {_differences(rows[0], rows[peer], peer, calls)}"
    )


def _differences(a: list[int], b: list[int], peer: int, calls: list[tuple]) -> str:
    """How rank 0's row `a` and rank `peer`'s row `b` differ, in words (the window bytes, which
    follow from the rest, last)."""

    def both(x, y):
        return f"{x} on rank 0, {y} on rank {peer}"

    parts = [
        f"{field} ({both(a[k], b[k])})" if field in _SHOWN else field
        for k, field in enumerate(_HEADER[:_WINDOW])
        if k and a[k] != b[k]
    ]
    if a[_BARRIER] != b[_BARRIER] and min(a[_BARRIER], b[_BARRIER]) >= 0:  # -1: owned
        parts.append(f"barrier ({both(bool(a[_BARRIER]), bool(b[_BARRIER]))})")
    if a[_OTHERS] != b[_OTHERS]:
        parts.append("other arguments (as the calls show)")
    world, start = (len(a) - len(_HEADER)) // 2, len(_HEADER)
    hints = []
    same_call = a[1:4] == b[1:4]  # entry point, mode and layout: the splits mean the same
    for which, at, none in (("seq_splits", start, 2), ("head_splits", start + world, 3)):
        mine, theirs = a[at : at + world], b[at : at + world]
        if mine != theirs:
            parts.append(f"the resolved {which} ({both(mine, theirs)})")
            if same_call and any(call[none] for call in calls):
                hints.append(
                    f"{which}=None means an even split: ranks whose "
                    f"{'rows' if which == 'seq_splits' else 'heads'} differ must pass "
                    f"{which}, the same list on every rank"
                )
    if a[_WINDOW] != b[_WINDOW]:
        parts.append(f"window bytes ({both(a[_WINDOW], b[_WINDOW])})")
    return "they differ in " + ", ".join(parts) + (f" ({'; '.join(hints)})" if hints else "")


def _gather_device_type(process_group) -> str:
    """The device type of the call check's gather: the CPU where the group's backend takes CPU
    tensors (gloo, or a CPU backend beside NCCL), else the group's device (NCCL: CUDA)."""
    try:
        return dist.distributed_c10d._get_object_coll_device(process_group)
    except Exception:  # noqa: BLE001 - a torch without the helper: gloo's CPU
        return "cpu"


def _default_device(device_type: str) -> torch.device:
    if device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(device_type)
