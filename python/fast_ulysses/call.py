"""One collective call, described once: `Call`, built at each entry point of both groups (and
by the fused op and the fast op's backward) and passed along whole to everything that reads the
call: the fast group's checks, the debug check (`fast_ulysses.debug.check_agreement`), the
fallback's call check (`fast_ulysses.call_check`), the messages that name a call (`describe`)
and the op's arguments (`fast_ulysses.group.UlyssesGroup`).

A field that no check reads by name (`NAMED`), such as one added here later, still reaches
both cross-rank checks: each compares every other field as it is (`others`), so ranks that
differ in it are refused without the checks being edited.
"""

from __future__ import annotations

from typing import Any, NamedTuple

OWNED = "all_to_all_single_4d"
BORROWED = "all_to_all_single_4d_borrowed"


class Call(NamedTuple):
    """One call as made. The values are the caller's, unconverted (the checks refuse what is
    wrong on every rank at once); a frozen tuple, cheap to build on the per-call path."""

    entry: str  # the entry point, as messages name it (OWNED, BORROWED, ...)
    x: Any  # this rank's input
    mode: Any
    tag: Any  # resolved: auto_tag's name for tag=None
    seq_splits: Any
    head_splits: Any
    layout: Any
    barrier: Any  # the borrowed entry's; None where the entry has none
    out: Any  # the owned entry's out=, or None


# The fields the checks read by name; every other one is compared across ranks as it is.
NAMED = frozenset(
    {"entry", "x", "mode", "tag", "seq_splits", "head_splits", "layout", "barrier", "out"}
)

new_call = tuple.__new__  # new_call(Call, (entry, x, ...)): every field, without __new__'s cost


def make_call(
    entry, x, mode, tag, seq_splits=None, head_splits=None, layout="bshd", barrier=None, out=None
):
    """A `Call` with the defaults of the entry points (for the paths that are not per call)."""
    return new_call(Call, (entry, x, mode, tag, seq_splits, head_splits, layout, barrier, out))


def others(c) -> tuple:
    """The fields of `c` that no check reads by name, as (name, value) pairs."""
    return tuple((name, value) for name, value in zip(c._fields, c) if name not in NAMED)


def describe(c) -> str:
    """One call as messages name it: `entry(x=(shape) dtype, mode=..., tag=..., ...)`, with
    barrier and out where given and every other field."""
    x = c.x
    shown_mode = int(c.mode) if isinstance(c.mode, int) else repr(c.mode)
    parts = [
        f"x={tuple(getattr(x, 'shape', ()))} {getattr(x, 'dtype', type(x))}",
        f"mode={shown_mode}",
        f"tag={c.tag!r}",
        f"seq_splits={_list(c.seq_splits)}",
        f"head_splits={_list(c.head_splits)}",
        f"layout={c.layout!r}",
    ]
    if c.barrier is not None:
        parts.append(f"barrier={c.barrier!r}")
    if c.out is not None:
        out = c.out
        shown = f"{tuple(out.shape)} {out.dtype}" if hasattr(out, "shape") else type(out).__name__
        parts.append(f"out={shown}")
    parts += [f"{name}={value!r}" for name, value in others(c)]
    return f"{c.entry}({', '.join(parts)})"


def _list(values):
    try:
        return None if values is None else [int(v) for v in values]
    except (TypeError, ValueError):
        return values
