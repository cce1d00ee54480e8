"""The 2-D (ring x Ulysses) entry on ranks launched as two simulated nodes (launch(nodes=2):
torchrun's GROUP_RANK, LOCAL_RANK, LOCAL_WORLD_SIZE of each node), gloo CPU ranks.

Checks, in order (every rank runs each; an expected error must come on every rank):
    node_identity               a rank's node is its host plus "#<GROUP_RANK>"
    usp_mesh_groups             usp_mesh(ranks per node): a Ulysses group per node, rings across
    make_group_mesh             make_group(mesh): the Ulysses group is the node's (an all-to-all
                                moves the node's rows), group.ring_group is the mesh's ring
    make_group_pair             make_group((ulysses_pg, ring_pg)): ring_group is the second
    make_group_mesh_dim         a mesh with other names, through mesh_dim=
    plain_group_spans_nodes     make_group(world): no ring_group, fallback_reason names 2 nodes
    spanning_usp_mesh_errs      usp_mesh(2 x ranks per node): the error names the nodes
    spanning_mesh_errs          a mesh or a pair whose Ulysses groups cross nodes: the error
    bad_degree_errs             a degree not dividing the world; a pair whose Ulysses group
                                and ring share more than the rank (not a grid)
    cfg_slice                   make_group(mesh["ring", "ulysses"]) of a (cfg, ring, ulysses)
                                mesh: the slice's groups, each on half the world
    doctor_layout               doctor's layout (from torchrun's environment) is the mesh's
    usp_attention_matches_sdpa  UlyssesAttention(make_group(usp_mesh(ranks per node))): each
                                rank's output rows are SDPA's over the whole sequence (fp32)
"""

from __future__ import annotations

import os
import socket
import sys

import torch
import torch.distributed as dist
from multirank import Report
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import fast_ulysses as fu
from fast_ulysses.cli import doctor
from fast_ulysses.topology_probe import node_name

CHECKS = (
    "node_identity",
    "usp_mesh_groups",
    "make_group_mesh",
    "make_group_pair",
    "make_group_mesh_dim",
    "plain_group_spans_nodes",
    "spanning_usp_mesh_errs",
    "spanning_mesh_errs",
    "bad_degree_errs",
    "cfg_slice",
    "doctor_layout",
    "usp_attention_matches_sdpa",
)


def raises(fn, *words: str) -> str:
    """Calls fn; asserts it raises FastUlyssesError whose message holds every word."""
    try:
        fn()
    except fu.FastUlyssesError as error:
        missing = [w for w in words if w not in str(error)]
        assert not missing, f"the error lacks {missing}: {error}"
        return str(error)
    raise AssertionError(f"no FastUlyssesError (wanted one saying {words})")


def ranks_of(pg) -> list[int]:
    return dist.get_process_group_ranks(pg)


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = int(os.environ["LOCAL_WORLD_SIZE"])
    node, local = rank // per_node, rank % per_node
    node_ranks = list(range(node * per_node, (node + 1) * per_node))
    ring_ranks = list(range(local, world, per_node))
    report = Report(rank)

    with report.check("node_identity"):
        assert node_name() == f"{socket.gethostname()}#{node}", node_name()
        assert int(os.environ["LOCAL_RANK"]) == local

    with report.check("usp_mesh_groups"):
        mesh = fu.usp_mesh(per_node)
        assert mesh.mesh_dim_names == ("ring", "ulysses"), mesh.mesh_dim_names
        assert tuple(mesh.shape) == (world // per_node, per_node), mesh.shape
        assert ranks_of(mesh.get_group("ulysses")) == node_ranks
        assert ranks_of(mesh.get_group("ring")) == ring_ranks

    with report.check("make_group_mesh"):
        group = fu.make_group(mesh)
        assert group.ring_group is mesh.get_group("ring")
        assert (group.world_size, group.rank) == (per_node, local)
        # (b, s/P, N, d) -> (b, S, N/P, d): row block i comes from Ulysses member i.
        x = torch.full((1, 2, per_node, 1), float(rank))
        y = group.all_to_all_single_4d(x, 0, "mesh_q")
        got = [int(v) for v in y[0, ::2, 0, 0]]
        assert got == node_ranks, f"rows from world ranks {got}, want this node's {node_ranks}"
        seen = [None] * (world // per_node)
        dist.all_gather_object(seen, rank, group=group.ring_group)
        assert seen == ring_ranks, seen

    with report.check("make_group_pair"):
        pair = (mesh.get_group("ulysses"), mesh.get_group("ring"))
        group = fu.make_group(pair)
        assert group.ring_group is pair[1] and group.world_size == per_node

    with report.check("make_group_mesh_dim"):
        other = init_device_mesh("cpu", (world // per_node, per_node), mesh_dim_names=("cp", "sp"))
        group = fu.make_group(other, mesh_dim="sp")
        assert group.ring_group is other.get_group("cp") and group.world_size == per_node
        raises(lambda: fu.make_group(other), "mesh_dim='ulysses'", "('cp', 'sp')")

    with report.check("plain_group_spans_nodes"):
        group = fu.make_group(dist.group.WORLD)
        assert group.ring_group is None and group.fallback
        assert "spans 2 nodes" in group.fallback_reason, group.fallback_reason

    with report.check("spanning_usp_mesh_errs"):
        raises(lambda: fu.usp_mesh(2 * per_node), "spans 2 nodes", f"{socket.gethostname()}#1")

    with report.check("spanning_mesh_errs"):
        # Ulysses groups of one rank per node: [[0, P], [1, P + 1], ...].
        across = torch.arange(world).reshape(2, per_node).t().contiguous()
        crossing = DeviceMesh("cpu", across, mesh_dim_names=("ring", "ulysses"))
        assert ranks_of(crossing.get_group("ulysses")) == [local, local + per_node]
        raises(lambda: fu.make_group(crossing), "spans 2 nodes", "within one node")
        pair = (crossing.get_group("ulysses"), crossing.get_group("ring"))
        raises(lambda: fu.make_group(pair), "spans 2 nodes")

    with report.check("bad_degree_errs"):
        raises(lambda: fu.usp_mesh(3), "ulysses_degree=3", f"divide the world size {world}")
        raises(
            lambda: fu.make_group((dist.group.WORLD, mesh.get_group("ring"))),
            f"rank 0: its Ulysses group (ranks {', '.join(map(str, range(world)))})",
            f"share ranks 0, {per_node}",
            "meet at that rank only",
        )

    with report.check("cfg_slice"):
        # (cfg 2, ring R, ulysses 2), R = world / 4: each CFG half is one node's R x 2 grid.
        R = world // 4
        cube = init_device_mesh("cpu", (2, R, 2), mesh_dim_names=("cfg", "ring", "ulysses"))
        raises(lambda: fu.make_group(cube), "3-D DeviceMesh", "mesh['ring', 'ulysses']")
        group = fu.make_group(cube["ring", "ulysses"])
        start = rank - rank % (2 * R)
        assert ranks_of(group.ring_group) == [start + rank % 2 + 2 * i for i in range(R)]
        assert group.world_size == 2 and group.rank == rank % 2

    with report.check("doctor_layout"):
        layout = doctor.usp_layout(per_node)  # sizes from torchrun's environment
        assert layout["within_nodes"] and not layout["error"], layout
        assert node_ranks in [g["ranks"] for g in layout["ulysses_groups"]], layout
        assert ring_ranks in [g["ranks"] for g in layout["rings"]], layout
        spanning = doctor.usp_layout(2 * per_node)
        assert not spanning["within_nodes"] and "spans 2 nodes" in spanning["error"], spanning

    with report.check("usp_attention_matches_sdpa") as entry:
        # World rank r holds sequence rows r*s .. r*s+s-1: ring block, then Ulysses member.
        gen = torch.Generator().manual_seed(46)
        b, s, heads, d = 2, 3, 2 * per_node, 8
        q, k, v = (torch.randn(b, world * s, heads, d, generator=gen) for _ in range(3))
        attention = fu.UlyssesAttention(fu.make_group(fu.usp_mesh(per_node)))
        mine = slice(rank * s, (rank + 1) * s)
        out = attention(q[:, mine], k[:, mine], v[:, mine])
        whole = torch.nn.functional.scaled_dot_product_attention(
            *(t.transpose(1, 2) for t in (q, k, v))
        ).transpose(1, 2)
        torch.testing.assert_close(out, whole[:, mine], rtol=1e-5, atol=1e-5)
        entry["detail"] = f"ring {world // per_node} x Ulysses {per_node}, {tuple(q.shape)}"

    report.finish()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
