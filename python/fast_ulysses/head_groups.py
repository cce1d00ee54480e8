"""The heads of one `UlyssesAttention` call, in groups: grouped-query attention (k and v with
fewer heads than q) and the pipelined module (`pipeline=G`).

Every rank computes the same `HeadGroup`s from the call alone (shapes, q's resolved head splits,
G), so every rank makes the same calls in the same order (the ordering contract).

A group is a range of q's heads, [q_start, q_start + q_count), sent with `q_splits` (one count
per rank). Without a pipeline there is one group: every head, q's head splits. With G groups,
each rank's q head count is cut into G parts (larger parts first) and group g gathers every
rank's g-th part, so each rank attends to as many heads as without the pipeline, and the G
groups' outputs, in order, are the output's heads in order (one `torch.cat`).

q head i uses kv head i // (Hq // Hkv). Each rank receives only the kv heads its q heads of the
group use: the kv send tensor is, in rank order, each rank's range of kv heads (a kv head two
ranks use travels twice; none does when every rank's q heads are whole kv groups, as when Hkv
is a multiple of P with even splits: then the send tensor is k itself, or one slice of it). Where
every rank's head counts are multiples of Hq // Hkv, the pipeline cuts them in whole kv groups,
so no kv head travels in two groups.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .errors import FastUlyssesError


def check_pipeline(pipeline) -> int:
    """`pipeline` of UlyssesAttention: an int >= 1 (the number of head groups).

    Raises:
        FastUlyssesError naming the value.
    """
    if type(pipeline) is not int or pipeline < 1:
        raise FastUlyssesError(
            f"pipeline is {pipeline!r}: it must be an int >= 1, the number "
            "of head groups (1: no pipeline)"
        )
    return pipeline


@dataclass(frozen=True)
class HeadGroup:
    """One group's heads (every rank's view of the same call).

    q_start, q_count, q_splits: the group's q heads and their split over the ranks.
    kv_ranges: per rank, the [lo, hi) range of kv heads its q heads use ((0, 0): no q heads).
    kv_splits: per rank, hi - lo (the kv call's head_splits).
    pieces: the kv send tensor as [lo, hi) ranges of k's heads, consecutive ranges merged.
    counts: per rank, how many of its q heads use each of its kv heads, in order.
    gqa: some rank's kv heads serve more than one q head each.
    uniform: every rank's kv heads serve equally many q heads each (SDPA's enable_gqa).
    """

    q_start: int
    q_count: int
    q_splits: tuple
    kv_ranges: tuple
    kv_splits: tuple
    pieces: tuple
    counts: tuple
    gqa: bool
    uniform: bool


def _parts(count: int, groups: int) -> list[int]:
    return [count // groups + (1 if g < count % groups else 0) for g in range(groups)]


@functools.lru_cache(maxsize=256)
def head_groups(q_splits: tuple, kv_heads: int, pipeline: int) -> tuple:
    """The `HeadGroup`s of a call whose q heads are split `q_splits` (resolved, one per rank),
    with `kv_heads` kv heads (a divisor of sum(q_splits)), in `pipeline` groups.

    Raises:
        FastUlyssesError when some group would have no head: pipeline must be at most the
        largest q head count of one rank.
    """
    ratio = sum(q_splits) // kv_heads
    most = max(q_splits)
    if pipeline > most:
        raise FastUlyssesError(
            f"pipeline is {pipeline} but no rank holds more than {most} q heads (head splits "
            f"{list(q_splits)}): pipeline must be at most the largest per-rank head count, so "
            "that every head group has a head"
        )
    # Whole kv groups where every rank's heads are whole kv groups and G allows it.
    unit = ratio if all(h % ratio == 0 for h in q_splits) and pipeline <= most // ratio else 1
    cut = [[unit * c for c in _parts(h // unit, pipeline)] for h in q_splits]
    out, start = [], 0
    for g in range(pipeline):
        splits = tuple(cut[r][g] for r in range(len(q_splits)))
        out.append(_head_group(start, splits, ratio))
        start += sum(splits)
    return tuple(out)


def _head_group(q_start: int, q_splits: tuple, ratio: int) -> HeadGroup:
    ranges, counts, offset = [], [], q_start
    for h in q_splits:
        if h == 0:
            ranges.append((0, 0))
            counts.append(())
            continue
        lo, hi = offset // ratio, (offset + h - 1) // ratio + 1
        ranges.append((lo, hi))
        counts.append(
            tuple(min(offset + h, (c + 1) * ratio) - max(offset, c * ratio) for c in range(lo, hi))
        )
        offset += h
    pieces: list[list[int]] = []
    for lo, hi in ranges:
        if hi == lo:
            continue
        if pieces and pieces[-1][1] == lo:
            pieces[-1][1] = hi
        else:
            pieces.append([lo, hi])
    return HeadGroup(
        q_start=q_start,
        q_count=sum(q_splits),
        q_splits=q_splits,
        kv_ranges=tuple(ranges),
        kv_splits=tuple(hi - lo for lo, hi in ranges),
        pieces=tuple(tuple(p) for p in pieces),
        counts=tuple(counts),
        gqa=any(n > 1 for c in counts for n in c),
        uniform=all(len(set(c)) <= 1 for c in counts),
    )


def kv_send(t: torch.Tensor, group: HeadGroup, h_dim: int) -> torch.Tensor:
    """This rank's kv send tensor of `group` from `t` (k or v, every kv head): `t` itself when
    the group uses each of its heads once, in order; else its pieces, concatenated (a copy)."""
    if len(group.pieces) == 1:
        lo, hi = group.pieces[0]
        if lo == 0 and hi == t.shape[h_dim]:
            return t
        return t.narrow(h_dim, lo, hi - lo).contiguous()
    return torch.cat([t.narrow(h_dim, lo, hi - lo) for lo, hi in group.pieces], dim=h_dim)


def q_send(t: torch.Tensor, group: HeadGroup, h_dim: int) -> torch.Tensor:
    """This rank's q send tensor of `group`: `t`, or its heads of the group (a copy: a head slice
    of bshd or sbhd is not contiguous)."""
    if group.q_count == t.shape[h_dim]:
        return t
    return t.narrow(h_dim, group.q_start, group.q_count).contiguous()


def expand_kv(t: torch.Tensor, counts: tuple) -> torch.Tensor:
    """(b, h_kv, s, d) -> (b, h_q, s, d): kv head c repeated counts[c] times (views and one
    cat, no index tensor: nothing makes the host wait for the device)."""
    if all(n == 1 for n in counts):
        return t
    b, _, s, d = t.shape
    return torch.cat([t.narrow(1, c, 1).expand(b, n, s, d) for c, n in enumerate(counts)], dim=1)
