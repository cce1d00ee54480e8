"""`make_group`: the fast group where it pays, the torch fallback where it would lose."""

from __future__ import annotations

from .topology import PREFERENCES, decide, gather_topology
from .torch_group import TorchUlyssesGroup


def make_group(process_group=None, initial_pool_bytes: int = 0, prefer: str = "auto"):
    """Builds the Ulysses group for `process_group`; collective: every rank calls it.

    The ranks gather one topology (so they all reach the same verdict), `topology.decide` picks
    the implementation, and the group says what it chose: `group.fallback` (bool) and
    `group.fallback_reason` ("" for the fast group).

    Arguments:
        process_group: the sequence-parallel group (None: the default group).
        initial_pool_bytes: the fast group's first window pool size (the fallback ignores it).
        prefer: "auto", "fast" (fast wherever it can run) or "torch" (always the fallback).

    Returns:
        A `fast_ulysses.group.UlyssesGroup` or a `TorchUlyssesGroup`.

    Raises:
        ValueError for a bad `prefer`, or prefer="fast" where the fast path cannot run.
    """
    if prefer not in PREFERENCES:
        raise ValueError(f"prefer is {prefer!r}: it must be one of 'auto', 'fast', 'torch'")
    if process_group is None:
        import torch.distributed as dist

        process_group = dist.group.WORLD
    topology = None
    if prefer == "torch":  # no need to probe anything
        use_fast, reason = False, "prefer='torch'"
    else:
        topology = gather_topology(process_group)
        use_fast, reason = decide(topology, prefer)
    if not use_fast:
        group = TorchUlyssesGroup(process_group, initial_pool_bytes)
        group.fallback_reason = reason
        return group
    from .group import UlyssesGroup  # the fast group needs the CUDA part: import it only here

    return UlyssesGroup(process_group, initial_pool_bytes, topology=topology)
