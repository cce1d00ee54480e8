"""`make_group`: the fast group where it pays, the torch fallback where it would lose; and
`UlyssesGroupLike`, the protocol of what it returns."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist

from ._ops import _C
from .errors import FastUlyssesError, public
from .mesh import ULYSSES_DIM, split_2d
from .topology import check_prefer, decide
from .topology_probe import gather_topology
from .torch_group import TorchUlyssesGroup


@public  # (the plan's group-size rule is C++, a plain ValueError)
def make_group(
    process_group=None,
    initial_pool_bytes: int = 0,
    prefer: str = "auto",
    *,
    mesh_dim: str = ULYSSES_DIM,
):
    """Builds the Ulysses group for `process_group`; collective: every rank calls it.

    The ranks gather one topology (so they all reach the same verdict), `topology.decide` picks
    the implementation once, and the group it builds takes that frozen `Decision` (no check is
    run twice). The group says what was chosen: `group.fallback` (bool) and
    `group.fallback_reason` ("" for the fast group).

    Past one node (ring x Ulysses), pass a 2-D DeviceMesh (`fast_ulysses.usp_mesh`) or a pair
    (ulysses_group, ring_group): the group is built on the Ulysses group as above and
    `group.ring_group` is the ring's ProcessGroup (None for a plain group). Every rank of the
    world calls it then, and each Ulysses group must lie within one node (`mesh.check_2d`).

    Arguments:
        process_group: the sequence-parallel group (None: the default group); a
            torch.distributed.device_mesh.DeviceMesh (1-D: the Ulysses group alone; 2-D: its
            `mesh_dim` dimension is the Ulysses group, the other the ring); or a pair
            (ulysses_group, ring_group) of ProcessGroups.
        initial_pool_bytes: the fast group's first window pool size (the fallback ignores it).
        prefer: "auto", "fast" (fast wherever it can run) or "torch" (always the fallback).
        mesh_dim: the Ulysses dimension's name in a 2-D mesh ("ulysses", usp_mesh's name).

    Returns:
        A `fast_ulysses.group.UlyssesGroup` or a `TorchUlyssesGroup` (both `UlyssesGroupLike`).

    Raises:
        FastUlyssesError (a ValueError) for a `process_group` that is neither None nor a
        torch.distributed ProcessGroup, for None before `torch.distributed.init_process_group`,
        for a bad `prefer`, for a group of more ranks than one node's 8 (the plan's
        limit, which the fallback shares), for a FAST_ULYSSES_* setting refused on any rank or
        FAST_ULYSSES_DEBUG=1 on some ranks only (unless prefer="torch"; every rank raises it,
        naming the ranks), or prefer="fast" where the fast path cannot run. For the 2-D forms,
        on every rank before the group is built: a mesh neither 1-D nor 2-D, a `mesh_dim` the
        mesh lacks, a pair that is not two ProcessGroups, a Ulysses group and ring that share
        more than this rank (not a grid), or a Ulysses group that spans nodes.
    """
    check_prefer(prefer)
    process_group, ring_group = split_2d(process_group, mesh_dim)
    group = _build(_check_process_group(process_group), initial_pool_bytes, prefer)
    if ring_group is not None:
        group.ring_group = ring_group
    return group


def _build(process_group, initial_pool_bytes: int, prefer: str):
    """`make_group` on one checked ProcessGroup: the decision, then the group it names."""
    # Before the topology gather: no fallback would serve a larger group either.
    _C.check_group(dist.get_world_size(process_group), dist.get_rank(process_group))
    topology = None if prefer == "torch" else gather_topology(process_group)  # torch: no probe
    decision = decide(topology, prefer)
    if not decision.use_fast:
        return TorchUlyssesGroup(process_group, initial_pool_bytes, decision=decision)
    from .group import UlyssesGroup  # the fast group needs the CUDA part: import it only here

    # require_nvlink=False: `decide` already judged the links (it keeps PCIe within a socket).
    return UlyssesGroup(
        process_group,
        initial_pool_bytes,
        require_nvlink=False,
        decision=decision,
        topology=topology,
    )


def _check_process_group(process_group):
    """`process_group`, or the default group for None.

    Raises:
        FastUlyssesError naming process_group: neither None nor a ProcessGroup, or None before
        the default group exists.
    """
    if process_group is None:
        if not dist.is_available() or not dist.is_initialized():
            raise FastUlyssesError(
                "process_group is None but torch.distributed is not initialized: call "
                "torch.distributed.init_process_group first, or pass a ProcessGroup"
            )
        return dist.group.WORLD
    if dist.is_available() and isinstance(process_group, dist.ProcessGroup):
        return process_group
    if dist.is_available() and process_group is dist.GroupMember.NON_GROUP_MEMBER:
        raise FastUlyssesError(
            f"process_group is {process_group!r} (GroupMember.NON_GROUP_MEMBER): this rank is "
            "not in the group new_group made; call make_group on its members only"
        )
    raise FastUlyssesError(
        f"process_group is {process_group!r}: it must be None (the default group) or a "
        "torch.distributed ProcessGroup"
    )


@runtime_checkable
class UlyssesGroupLike(Protocol):
    """What `make_group` returns: `UlyssesGroup` and `TorchUlyssesGroup` both satisfy it."""

    rank: int
    world_size: int
    fallback: bool
    fallback_reason: str

    def all_to_all_single_4d(
        self,
        x: torch.Tensor,
        mode: int,
        tag: str | None = None,
        *,
        seq_splits: Sequence[int] | None = None,
        head_splits: Sequence[int] | None = None,
        layout: str = "bshd",
        out: torch.Tensor | None = None,
        use_tma: bool | None = None,
        wire_dtype: torch.dtype | None = None,
        dequantize: bool = True,
    ) -> torch.Tensor: ...

    def all_to_all_single_4d_borrowed(
        self,
        x: torch.Tensor,
        mode: int,
        tag: str,
        *,
        seq_splits: Sequence[int] | None = None,
        head_splits: Sequence[int] | None = None,
        layout: str = "bshd",
        barrier: bool = True,
        wire_dtype: torch.dtype | None = None,
        dequantize: bool = True,
    ) -> torch.Tensor: ...

    def barrier(self) -> None: ...

    def reserve(self, calls: Iterable) -> None: ...

    def stats(self) -> dict: ...

    def destroy(self) -> None: ...
