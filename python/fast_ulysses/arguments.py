"""The arguments both groups take, as the ops take them: `Mode`, and the conversions and checks
of mode, splits, `initial_pool_bytes` and the tag (`as_mode`, `as_splits`, `as_pool_bytes`,
`check_tag`), so both groups and `plan()` take and refuse the same values; and `group_repr`,
the one repr shape of both groups.

Nothing here imports the plan or torch.distributed, so every other module may import it.
"""

from __future__ import annotations

import enum
import operator

import torch

from .errors import FastUlyssesError

_INT64 = (-(2**63), 2**63 - 1)  # what the ops' int arguments hold


class Mode(enum.IntEnum):
    """The direction of an all-to-all. Plain ints (0, 1) are accepted wherever a Mode is."""

    SEQ_TO_HEAD = 0  # (b, seq_splits[r], N, d) -> (b, S, head_splits[r], d)
    HEAD_TO_SEQ = 1  # the inverse


def as_mode(mode) -> int:
    """`mode` as the plain int the ops take (a `Mode` or any int; the plan checks its range).

    Raises:
        FastUlyssesError if mode is not an int (a bool is not one here) or does not fit int64.
    """
    if isinstance(mode, int) and not isinstance(mode, bool):
        value = int(mode)
        if _INT64[0] <= value <= _INT64[1]:
            return value
        raise FastUlyssesError(f"mode is {value}: it must fit in int64 (-2^63 to 2^63 - 1)")
    raise FastUlyssesError(
        f"mode is {mode!r}: it must be an int, 0 (Mode.SEQ_TO_HEAD) or 1 (Mode.HEAD_TO_SEQ)"
    )


def as_splits(values, name: str = "splits") -> list[int] | None:
    """Split sizes as the plain int list the ops take (None stays None: even splits). Every
    entry point and `plan()` convert splits here, so both groups take and refuse the same ones.

    Raises:
        FastUlyssesError naming `name` and the entry for anything that is not an integer (a
        float is never cut short, a bool is not a size) or does not fit int64, or a `values`
        that is not a sequence.
    """
    if values is None:
        return None
    if type(values) is list or type(values) is tuple:  # the common case: no abc check
        out = list(values)
    else:
        try:
            if isinstance(values, (str, bytes)):
                raise TypeError
            out = list(values)
        except TypeError:
            raise FastUlyssesError(
                f"{name} is {values!r}: it must be a sequence of ints, one per rank"
            ) from None
    for i, v in enumerate(out):
        if type(v) is not int:  # (the common case costs one type check per entry)
            out[i] = _as_int(v, f"{name}[{i}]", "split sizes must be ints")
        if not _INT64[0] <= out[i] <= _INT64[1]:
            raise FastUlyssesError(
                f"{name}[{i}] is {out[i]}: it must fit in int64 (-2^63 to 2^63 - 1)"
            )
    return out


def _as_int(value, name: str, rule: str) -> int:
    """`value` as an int when it is an integer (anything with __index__ but a bool, or a bool
    tensor), else ValueError("<name> is <value>: <rule>")."""
    try:
        if isinstance(value, bool) or getattr(value, "dtype", None) == torch.bool:
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise FastUlyssesError(f"{name} is {value!r}: {rule}") from None


def as_pool_bytes(value) -> int:
    """`initial_pool_bytes` of both groups: an int >= 0.

    Raises:
        ValueError naming the value.
    """
    rule = "it must be an int >= 0"
    size = _as_int(value, "initial_pool_bytes", rule)
    if size < 0:
        raise FastUlyssesError(f"initial_pool_bytes is {value!r}: {rule}")
    return size


def check_tag(tag) -> str:
    """The tag rule of every entry point and of `CallSpec`: a non-empty str.

    Raises:
        ValueError naming the tag.
    """
    if not isinstance(tag, str) or not tag:
        raise FastUlyssesError(f"tag is {tag!r}: a tag must be a non-empty str")
    return tag


def check_tags(tags, names: tuple[str, ...]) -> tuple[str, ...]:
    """A module's tags: a tuple or list of one tag per name in `names` (e.g. ("q", "k")), each
    a non-empty str, all different (two calls in flight on one tag would share a window).

    Raises:
        ValueError naming `tags` and the rule.
    """
    rule = f"it must be a tuple or list of {len(names)} different tags ({', '.join(names)})"
    if not isinstance(tags, (tuple, list)) or len(tags) != len(names):
        raise FastUlyssesError(f"tags is {tags!r}: {rule}")
    for tag in tags:
        check_tag(tag)
    if len(set(tags)) != len(tags):
        raise FastUlyssesError(f"tags is {tags!r}: {rule}")
    return tuple(tags)


def group_repr(
    cls_name: str,
    rank: int,
    world_size: int,
    fallback: bool,
    *,
    device=None,
    reason: str = "",
    destroyed: bool = False,
) -> str:
    """One repr shape for both groups, e.g.
    `TorchUlyssesGroup(rank=1, world_size=4, fallback=True, reason='requested')` and
    `UlyssesGroup(rank=0, world_size=8, device=cuda:0, fallback=False)`."""
    parts = [f"rank={rank}", f"world_size={world_size}"]
    if device is not None:
        parts.append(f"device={device}")
    parts.append(f"fallback={fallback}")
    if fallback:
        parts.append(f"reason={reason!r}")
    if destroyed:
        parts.append("destroyed=True")
    return f"{cls_name}({', '.join(parts)})"
