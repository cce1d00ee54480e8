"""The 2-D (ring x Ulysses) layout of unified sequence parallelism past one node: `usp_mesh`
builds the standard DeviceMesh of the world, `make_group` takes a mesh or a pair of process
groups (`split_2d`), and one rule judges both: every Ulysses group within one node. `usp_mesh`'s
degrees must multiply to the world size; a mesh or pair given to `make_group` may cover part of
the world (beside a CFG dimension, say) as long as its groups form a grid.

The rule is judged on every rank from one gather of the ranks' nodes over the default group,
before anything else is sent, so every rank raises the same error or none does. Ulysses'
all-to-alls run on the fast group within a node; the ring's traffic goes through
torch.distributed (NCCL on GPUs) over the ring group: nothing here moves data across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from .errors import FastUlyssesError
from .topology_probe import node_name

RING_DIM = "ring"
ULYSSES_DIM = "ulysses"


@dataclass(frozen=True)
class UspLayout:
    """Which world ranks form each Ulysses group and each ring, and each rank's node.

    Arguments:
        ulysses_groups: the Ulysses groups, each a tuple of world ranks in group order.
        rings: the ring groups, likewise.
        nodes: `nodes[r]` is world rank r's node (`topology_probe.node_name`).
    """

    ulysses_groups: tuple[tuple[int, ...], ...]
    rings: tuple[tuple[int, ...], ...]
    nodes: tuple[str, ...]

    def nodes_of(self, ranks) -> list[str]:
        """The distinct nodes of `ranks`, in rank order."""
        return list(dict.fromkeys(self.nodes[r] for r in ranks))

    def spanning(self) -> list[tuple[int, ...]]:
        """The Ulysses groups whose ranks sit on more than one node."""
        return [g for g in self.ulysses_groups if len(self.nodes_of(g)) > 1]

    def describe(self) -> dict:
        """JSON-ready: each Ulysses group with its nodes and whether it is within one node,
        and each ring with its nodes (what `fast-ulysses doctor --ulysses-degree` prints)."""
        return {
            "ulysses_degree": len(self.ulysses_groups[0]),
            "ring_degree": len(self.rings[0]),
            "ulysses_groups": [
                {
                    "ranks": list(g),
                    "nodes": self.nodes_of(g),
                    "one_node": len(self.nodes_of(g)) == 1,
                }
                for g in self.ulysses_groups
            ],
            "rings": [{"ranks": list(g), "nodes": self.nodes_of(g)} for g in self.rings],
        }


def check_degree(world_size: int, ulysses_degree) -> None:
    """Raises FastUlyssesError unless `ulysses_degree` is an int >= 1 dividing `world_size`."""
    if type(ulysses_degree) is not int or ulysses_degree < 1:
        raise FastUlyssesError(f"ulysses_degree={ulysses_degree!r}: it must be an int >= 1")
    if world_size % ulysses_degree:
        raise FastUlyssesError(
            f"ulysses_degree={ulysses_degree}: it must divide the world size {world_size} "
            f"(ulysses degree x ring degree = world size; e.g. ranks per node)"
        )


def standard_layout(world_size: int, ulysses_degree: int, nodes) -> UspLayout:
    """The `(ring, ulysses)` layout of `usp_mesh`, row-major: world rank = ring index x
    ulysses_degree + Ulysses index, so each Ulysses group is `ulysses_degree` consecutive ranks
    (torchrun numbers a node's ranks consecutively) and each ring takes one rank of each.

    Raises:
        FastUlyssesError from `check_degree`.
    """
    check_degree(world_size, ulysses_degree)
    u, rings = ulysses_degree, world_size // ulysses_degree
    return UspLayout(
        ulysses_groups=tuple(tuple(range(i * u, (i + 1) * u)) for i in range(rings)),
        rings=tuple(tuple(range(j, world_size, u)) for j in range(u)),
        nodes=tuple(nodes),
    )


def spanning_message(layout: UspLayout) -> str:
    """The error for Ulysses groups that span nodes (the first named, the rest counted); ""
    when every Ulysses group lies within one node."""
    spanning = layout.spanning()
    if not spanning:
        return ""
    group = spanning[0]
    where = "; ".join(
        f"{node}: ranks {', '.join(str(r) for r in group if layout.nodes[r] == node)}"
        for node in layout.nodes_of(group)
    )
    more = f" (and {len(spanning) - 1} more Ulysses groups)" if len(spanning) > 1 else ""
    return (
        f"the Ulysses group of ranks {', '.join(map(str, group))} spans "
        f"{len(layout.nodes_of(group))} nodes ({where}){more}: each Ulysses group must lie "
        "within one node (the fast path is one node only); run the ring across nodes instead, "
        "e.g. fast_ulysses.usp_mesh(ulysses_degree=<ranks per node>)"
    )


def gather_nodes() -> list[str]:
    """Every world rank's node; collective over the default group."""
    nodes: list = [None] * dist.get_world_size()
    dist.all_gather_object(nodes, node_name())
    return nodes


def usp_mesh(ulysses_degree: int, *, device_type: str | None = None):
    """Builds the standard `(ring, ulysses)` DeviceMesh of the world; collective: every rank.

    Ulysses ranks are consecutive (world rank = ring index x ulysses_degree + Ulysses index), so
    with `ulysses_degree` = ranks per node each Ulysses group is one node's ranks and each ring
    takes one rank per node. `make_group(usp_mesh(u))` builds the Ulysses group and sets its
    `ring_group`.

    Arguments:
        ulysses_degree: ranks per Ulysses group (an int >= 1 dividing the world size).
        device_type: the mesh's device type (None: "cuda" where a GPU is visible, else "cpu").

    Returns:
        A torch.distributed.device_mesh.DeviceMesh of shape (world / ulysses_degree,
        ulysses_degree), dimension names ("ring", "ulysses").

    Raises:
        FastUlyssesError (a ValueError), on every rank and before any group is made, for a
        `ulysses_degree` that is not an int >= 1 dividing the world size, or for a Ulysses group
        that would span nodes (naming its ranks and nodes).
    """
    from torch.distributed.device_mesh import init_device_mesh

    _check_initialized("usp_mesh")
    world = dist.get_world_size()
    check_degree(world, ulysses_degree)  # every rank knows the world size: no gather needed
    message = spanning_message(standard_layout(world, ulysses_degree, gather_nodes()))
    if message:
        raise FastUlyssesError(message)
    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return init_device_mesh(
        device_type,
        (world // ulysses_degree, ulysses_degree),
        mesh_dim_names=(RING_DIM, ULYSSES_DIM),
    )


def split_2d(process_group, mesh_dim: str):
    """`make_group`'s first argument as (Ulysses process group, ring process group or None).

    A plain ProcessGroup or None passes through with no ring (make_group checks it). A 1-D
    DeviceMesh is its one group, with no ring. A 2-D DeviceMesh gives its `mesh_dim` dimension
    and the other one; a pair gives its two groups. A 2-D form is judged by `check_2d`
    (collective over the default group) before it is returned.

    Raises:
        FastUlyssesError naming the argument and the rule: a mesh of another dimension count, a
        `mesh_dim` the mesh lacks, a pair that is not two ProcessGroups, or `check_2d`'s errors.
    """
    from torch.distributed.device_mesh import DeviceMesh

    if isinstance(process_group, DeviceMesh):
        return _split_mesh(process_group, mesh_dim)
    if isinstance(process_group, (tuple, list)):
        pair = tuple(process_group)
        if len(pair) != 2 or not all(isinstance(g, dist.ProcessGroup) for g in pair):
            raise FastUlyssesError(
                f"process_group is {process_group!r}: a pair must be two ProcessGroups, "
                "(ulysses_group, ring_group), of which this rank is a member"
            )
        check_2d(*pair)
        return pair
    return process_group, None


def _split_mesh(mesh, mesh_dim: str):
    if mesh.ndim == 1:
        return mesh.get_group(), None
    names = mesh.mesh_dim_names
    if mesh.ndim != 2:
        raise FastUlyssesError(
            f"process_group is a {mesh.ndim}-D DeviceMesh {names}: it must be 1-D (the Ulysses "
            "group alone) or 2-D (ring x Ulysses); pass the 2-D slice, e.g. "
            "mesh['ring', 'ulysses']"
        )
    if not names or mesh_dim not in names:
        raise FastUlyssesError(
            f"mesh_dim={mesh_dim!r}: the mesh's dimension names are {names}; name the Ulysses "
            "dimension (mesh_dim='ulysses' for fast_ulysses.usp_mesh's mesh)"
        )
    ring_dim = names[1 - names.index(mesh_dim)]
    ulysses, ring = mesh.get_group(mesh_dim), mesh.get_group(ring_dim)
    check_2d(ulysses, ring)
    return ulysses, ring


def check_2d(ulysses_group, ring_group) -> None:
    """Judges a (Ulysses, ring) pair of process groups; collective over the default group.

    Every rank gathers each rank's node and group members, so every rank reaches the same
    verdict and raises the same error. The pairs may cover the world or a part of it each (a
    CFG dimension beside them, say): what counts is that they form a grid.

    Raises:
        FastUlyssesError: groups that are not the rows and columns of a grid (`_check_grid`:
        a Ulysses group and ring sharing another rank, members naming different groups, ring
        ranks at different Ulysses positions or in Ulysses groups of different sizes), or a
        Ulysses group that spans nodes (`spanning_message`).
    """
    _check_initialized("make_group with a mesh or a pair of groups")
    mine = (
        node_name(),
        tuple(dist.get_process_group_ranks(ulysses_group)),
        tuple(dist.get_process_group_ranks(ring_group)),
    )
    rows: list = [None] * dist.get_world_size()
    dist.all_gather_object(rows, mine)
    for rank, row in enumerate(rows):
        _check_grid(rank, row, rows)
    layout = UspLayout(
        ulysses_groups=tuple(dict.fromkeys(row[1] for row in rows)),
        rings=tuple(dict.fromkeys(row[2] for row in rows)),
        nodes=tuple(row[0] for row in rows),
    )
    message = spanning_message(layout)
    if message:
        raise FastUlyssesError(message)


def _check_grid(rank: int, row, rows) -> None:
    """Refuses rank's (Ulysses group, ring) unless they are a row and a column of a grid: its
    Ulysses group and ring meet at it only, every member of either names the same group, and
    every rank of its ring holds its position in its own Ulysses group (the same heads)."""
    _, ulysses, ring = row
    shared = sorted(set(ulysses) & set(ring))
    if shared != [rank]:
        raise FastUlyssesError(
            f"rank {rank}: its Ulysses group (ranks {_ranks(ulysses)}) and its ring (ranks "
            f"{_ranks(ring)}) share ranks {_ranks(shared)}: they must meet at that rank "
            "only (a ring takes one rank of each Ulysses group)"
        )
    for what, index, members in (("Ulysses group", 1, ulysses), ("ring", 2, ring)):
        for other in members:
            if rows[other][index] != members:
                raise FastUlyssesError(
                    f"rank {rank}'s {what} is ranks {_ranks(members)} but rank {other}'s is "
                    f"ranks {_ranks(rows[other][index])}: every member of a {what} must be "
                    "given the same one"
                )
    position = ulysses.index(rank)
    for other in ring:
        theirs = rows[other][1]
        if len(theirs) != len(ulysses) or theirs.index(other) != position:
            raise FastUlyssesError(
                f"rank {rank} is member {position} of its Ulysses group (ranks "
                f"{_ranks(ulysses)}) but rank {other} of its ring is member "
                f"{theirs.index(other)} of ranks {_ranks(theirs)}: the ranks of a ring must "
                "hold one position each in Ulysses groups of one size (they attend the same "
                "heads); list each ring's ranks in the same order as the Ulysses groups'"
            )


def _ranks(ranks) -> str:
    return ", ".join(map(str, ranks))


def _check_initialized(what: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise FastUlyssesError(
            f"{what} needs torch.distributed initialized: call "
            "torch.distributed.init_process_group first"
        )
