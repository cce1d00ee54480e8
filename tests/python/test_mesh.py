"""The 2-D (ring x Ulysses) entry: `usp_mesh`, `make_group` with a DeviceMesh or a pair of
process groups, a rank's node, and doctor's layout. The rules as pure functions and the argument
errors on a one-rank world here; two simulated nodes (2 x 2 ranks; 2 x 4 in the full tier) in
tests/workers/two_nodes.py, one pytest test per check."""

from __future__ import annotations

import json
import socket

import pytest
import torch.distributed as dist
from multirank import node_env
from torch.distributed.device_mesh import init_device_mesh
from two_nodes import CHECKS

import fast_ulysses as fu
from fast_ulysses import mesh as mesh_module
from fast_ulysses.cli import doctor
from fast_ulysses.mesh import check_degree, spanning_message, standard_layout
from fast_ulysses.topology import RankInfo, Topology, decide
from fast_ulysses.topology_probe import node_name

# 2 x 2 in the fast tier; 2 x 4 in the full tier (the same checks on more ranks per node).
LAUNCHES = [4, pytest.param(8, marks=pytest.mark.full)]


@pytest.mark.parametrize("name", CHECKS)
@pytest.mark.parametrize("nproc", LAUNCHES, ids=lambda n: f"2x{n // 2}")
def test_two_nodes(launch_ranks, nproc, name):
    launch = launch_ranks("two_nodes", nproc, timeout=300, nodes=2)
    launch.assert_check(name)


# -- the rules, pure ---------------------------------------------------------------------------


def test_standard_layout_puts_consecutive_ranks_in_each_ulysses_group():
    nodes = ["a"] * 4 + ["b"] * 4
    layout = standard_layout(8, 4, nodes)
    assert layout.ulysses_groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert layout.rings == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert layout.spanning() == [] and spanning_message(layout) == ""
    assert standard_layout(8, 2, nodes).rings == ((0, 2, 4, 6), (1, 3, 5, 7))


def test_a_ulysses_group_across_nodes_is_named_with_its_nodes():
    layout = standard_layout(8, 4, ["a", "a", "b", "b"] * 2)
    message = spanning_message(layout)
    assert "ranks 0, 1, 2, 3 spans 2 nodes (a: ranks 0, 1; b: ranks 2, 3)" in message
    assert "(and 1 more Ulysses groups)" in message and "usp_mesh" in message


@pytest.mark.parametrize(
    "world,degree,rule",
    [(4, 3, "ulysses_degree=3: it must divide the world size 4"), (4, 0, "an int >= 1")],
)
def test_a_degree_that_does_not_divide_the_world_is_refused(world, degree, rule):
    with pytest.raises(fu.FastUlyssesError, match=rule):
        check_degree(world, degree)


def test_two_nodes_of_cpu_ranks_fall_back_saying_so():
    ranks = tuple(RankInfo(hostname=f"h#{r // 2}") for r in range(4))
    use_fast, reason = decide(Topology(ranks))
    assert not use_fast and reason.startswith("the group spans 2 nodes (h#0: ranks 0, 1;")


def test_a_node_is_the_host_and_torchruns_node_rank(monkeypatch):
    monkeypatch.delenv("GROUP_RANK", raising=False)
    assert node_name() == socket.gethostname()
    monkeypatch.setenv("GROUP_RANK", "1")
    assert node_name() == f"{socket.gethostname()}#1"


def test_the_launcher_gives_each_simulated_node_torchruns_environment():
    assert node_env(5, 8, nodes=2) == dict(
        GROUP_RANK="1", NODE_RANK="1", GROUP_WORLD_SIZE="2", LOCAL_RANK="1", LOCAL_WORLD_SIZE="4"
    )
    assert node_env(5, 8)["LOCAL_RANK"] == "5" and node_env(5, 8)["GROUP_RANK"] == "0"


# -- make_group's forms on one rank ------------------------------------------------------------


def test_a_plain_group_has_no_ring(world1):
    assert fu.make_group(world1).ring_group is None
    assert fu.TorchUlyssesGroup.ring_group is None and fu.UlyssesGroup.ring_group is None


def test_a_2d_mesh_and_a_pair_set_the_ring(world1):
    mesh = fu.usp_mesh(1, device_type="cpu")
    assert mesh.mesh_dim_names == ("ring", "ulysses")
    group = fu.make_group(mesh, prefer="torch")
    assert group.ring_group is mesh.get_group("ring")
    pair = (mesh.get_group("ulysses"), mesh.get_group("ring"))
    assert fu.make_group(pair, prefer="torch").ring_group is pair[1]
    flat = init_device_mesh("cpu", (1,), mesh_dim_names=("sp",))
    assert fu.make_group(flat, prefer="torch").ring_group is None


@pytest.mark.parametrize(
    "make,rule",
    [
        (lambda m3, m2: fu.make_group(m3), "3-D DeviceMesh"),
        (lambda m3, m2: fu.make_group(m2, mesh_dim="sp"), "mesh_dim='sp': the mesh's dimension"),
        (lambda m3, m2: fu.make_group((dist.group.WORLD,)), "a pair must be two ProcessGroups"),
        (lambda m3, m2: fu.make_group((dist.group.WORLD, 1)), "a pair must be two ProcessGroups"),
        (lambda m3, m2: fu.usp_mesh("1"), "ulysses_degree='1': it must be an int >= 1"),
    ],
    ids=["3d_mesh", "missing_mesh_dim", "one_group", "not_a_group", "degree_not_int"],
)
def test_wrong_2d_inputs_name_the_argument(world1, make, rule):
    m3 = init_device_mesh("cpu", (1, 1, 1), mesh_dim_names=("cfg", "ring", "ulysses"))
    m2 = init_device_mesh("cpu", (1, 1), mesh_dim_names=("ring", "ulysses"))
    with pytest.raises(fu.FastUlyssesError, match=rule.replace("(", r"\(")):
        make(m3, m2)


# -- doctor ------------------------------------------------------------------------------------


def test_doctor_prints_the_layout_and_whether_each_ulysses_group_is_within_a_node(capsys):
    args = ["--no-symm-init", "--ulysses-degree", "2", "--world-size", "4", "--ranks-per-node"]
    assert doctor.main([*args, "2"]) == 0
    out = capsys.readouterr().out
    assert "USP layout of usp_mesh(2): 4 ranks, 2 per node" in out
    assert "│ Ulysses 1 │ 2, 3  │ node 1" in out and "│ ring 0    │ 0, 2  │ node 0, node 1" in out
    assert "Every Ulysses group lies within one node" in out
    assert doctor.main([*args, "1", "--json"]) == 0
    layout = json.loads(capsys.readouterr().out)["usp_layout"]
    assert (
        not layout["within_nodes"] and "spans 2 nodes (node 0: ranks 0; node 1" in layout["error"]
    )
    assert [g["one_node"] for g in layout["ulysses_groups"]] == [False, False]


def test_doctor_refuses_a_layout_that_does_not_fit(capsys):
    assert doctor.main(["--no-symm-init", "--ulysses-degree", "3", "--world-size", "4"]) == 2
    assert "ulysses_degree=3: it must divide the world size 4" in capsys.readouterr().err


def _grid_rows(ulysses_groups, rings):
    """check_2d's gathered rows, (node, Ulysses group, ring) per rank, for groups given whole."""
    world = sum(len(g) for g in ulysses_groups)
    of = lambda groups, r: next(g for g in groups if r in g)  # noqa: E731
    return [("n", of(ulysses_groups, r), of(rings, r)) for r in range(world)]


@pytest.mark.parametrize(
    "rings,rule",
    [
        (((0, 2), (1, 3)), None),
        (((0, 3), (1, 2)), "rank 0 is member 0 of its Ulysses group (ranks 0, 1) but rank 3"),
    ],
    ids=["grid", "ring_across_positions"],
)
def test_a_ring_must_take_one_ulysses_position(rings, rule):
    """Rings {0, 3}, {1, 2} over Ulysses groups {0, 1}, {2, 3} pair head block 0 with head block
    1: accepted, every rank's output would be wrong. The grid rule refuses it, naming both."""
    rows = _grid_rows(((0, 1), (2, 3)), rings)
    if rule is None:
        for rank, row in enumerate(rows):
            mesh_module._check_grid(rank, row, rows)
        return
    with pytest.raises(fu.FastUlyssesError) as error:
        for rank, row in enumerate(rows):
            mesh_module._check_grid(rank, row, rows)
    assert rule in str(error.value)


def test_members_must_name_the_same_ring():
    """Rank 0 says its ring is (0, 2), rank 2 says (2, 4): refused (ring_attention would wait)."""
    rows = [("n", (0, 1), (0, 2)), ("n", (0, 1), (1, 3, 5)), ("n", (2, 3), (2, 4))]
    rows += [("n", (2, 3), (1, 3, 5)), ("n", (4, 5), (0, 4)), ("n", (4, 5), (1, 3, 5))]
    with pytest.raises(fu.FastUlyssesError, match="rank 0's ring is ranks 0, 2 but rank 2's is"):
        mesh_module._check_grid(0, rows[0], rows)
