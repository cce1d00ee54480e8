"""decide() and make_group() on synthetic machines, and the probes on this one (no GPU needed)."""

from __future__ import annotations

import sys
import types

import pytest

from fast_ulysses import factory, topology_probe
from fast_ulysses.topology import PairInfo, RankInfo, Topology, decide, spans_sockets
from fast_ulysses.torch_group import TorchUlyssesGroup


def gpu(i: int, *, host="node0", socket=0, numa=None, **kw) -> RankInfo:
    """GPU i of `host`, on CPU socket `socket` (NUMA node = socket unless given)."""
    return RankInfo(
        hostname=host,
        gpu_index=i,
        gpu_name="H100",
        pci_bus_id=f"0000:{16 + i:02x}:00.0",
        uuid=f"{host}-gpu{i}",
        numa_node=socket if numa is None else numa,
        cpu_socket=socket,
        **kw,
    )


def machine(ranks, link="nvlink", *, can_map=True, path="", overrides=None) -> Topology:
    """Every pair of `ranks` over `link`; a PCIe `path` of "SYS" only between sockets;
    `overrides` {(a, b): PairInfo} replaces some pairs."""
    overrides = overrides or {}
    pairs = []
    for a in range(len(ranks)):
        for b in range(a + 1, len(ranks)):
            same = ranks[a].gpu_key == ranks[b].gpu_key
            across = ranks[a].cpu_socket != ranks[b].cpu_socket
            pcie_path = "NODE" if path == "SYS" and not across else path
            default = (
                PairInfo(a, b, True, "same-device")
                if same
                else PairInfo(a, b, can_map, link, pcie_path)
            )
            pairs.append(overrides.get((a, b), default))
    return Topology(tuple(ranks), tuple(pairs))


def dgx(n=8):
    """An 8-GPU NVLink box: GPUs 0-3 on socket 0, 4-7 on socket 1."""
    return [gpu(i, socket=i // 4) for i in range(n)]


def test_nvlink_across_sockets_is_fast():
    use_fast, reason = decide(machine(dgx()))
    assert use_fast, reason
    assert "nvlink" in reason


def test_pcie_within_one_socket_is_fast():
    pcie = [gpu(i, socket=i // 4) for i in range(8)]
    assert decide(machine(pcie[:4], "pcie", path="NODE"))[0]
    assert decide(machine(pcie[4:], "pcie", path="NODE"))[0]


def test_pcie_across_sockets_falls_back_naming_them():
    pcie = [gpu(i, socket=i // 4) for i in range(8)]
    use_fast, reason = decide(machine(pcie, "pcie", path="SYS"))
    assert not use_fast
    assert "CPU sockets 0 and 1" in reason and "PCIe" in reason


def test_four_on_pcie_one_socket_is_fast():
    assert decide(machine([gpu(i) for i in range(4)], "pcie", path="PXB"))[0]


def test_sys_path_counts_as_crossing_sockets_when_sockets_are_unknown():
    ranks = (gpu(0, socket=None), gpu(1, socket=None))
    use_fast, reason = decide(Topology(ranks, (PairInfo(0, 1, True, "pcie", "SYS"),)))
    assert not use_fast and "NVML: SYS" in reason
    assert decide(Topology(ranks, (PairInfo(0, 1, True, "pcie", "PHB"),)))[0] is True


def test_pcie_across_numa_nodes_of_one_socket_falls_back():
    ranks = [gpu(0, socket=0, numa=0), gpu(1, socket=0, numa=1)]
    use_fast, reason = decide(machine(ranks, "pcie", path="NODE"))
    assert not use_fast and "NUMA nodes 0 and 1" in reason


def test_unknown_link_across_sockets_falls_back():
    use_fast, reason = decide(machine(dgx(), "unknown"))
    assert not use_fast and "not known to be NVLink" in reason


def test_two_nodes_fall_back():
    ranks = [gpu(i % 4, host=f"node{i // 4}") for i in range(8)]
    pairs = machine(ranks).pairs
    across = tuple(PairInfo(p.a, p.b, False, "none") if p.a // 4 != p.b // 4 else p for p in pairs)
    use_fast, reason = decide(Topology(tuple(ranks), across))
    assert not use_fast
    assert "spans 2 nodes" in reason and "node0: ranks 0-3" in reason
    with pytest.raises(ValueError, match="spans 2 nodes"):
        decide(Topology(tuple(ranks), across), prefer="fast")


def test_shared_gpu_needs_the_opt_in_on_every_rank():
    shared = [gpu(0), gpu(0)]
    use_fast, reason = decide(machine(shared))
    assert not use_fast and "ranks 0 and 1 share one GPU" in reason
    assert "FAST_ULYSSES_ALLOW_SHARED_GPU=1" in reason
    half = [gpu(0, allow_shared_gpu=True), gpu(0)]
    assert decide(machine(half))[0] is False
    opted = [gpu(0, allow_shared_gpu=True), gpu(0, allow_shared_gpu=True)]
    assert decide(machine(opted))[0] is True
    # prefer="fast" (and a UlyssesGroup built directly) refuses it in the same words.
    with pytest.raises(ValueError, match="fast path cannot run here: ranks 0 and 1 share one GPU"):
        decide(machine(shared), prefer="fast")


def test_a_setting_refused_on_any_rank_raises_whatever_prefer_says():
    """A bad FAST_ULYSSES_* value on one rank is every rank's ValueError, never a fallback."""
    bad = "FAST_ULYSSES_EAGER_GRAPHS=x: must be 0 or 1"
    ranks = [gpu(i) for i in range(4)]
    ranks[2] = gpu(2, settings_error=bad)
    for prefer in ("auto", "fast"):
        with pytest.raises(ValueError, match=f"^rank 2: {bad}$"):
            decide(machine(ranks), prefer)
    ranks[3] = gpu(3, settings_error="FAST_ULYSSES_WATCHDOG_S=-1: no")
    with pytest.raises(ValueError, match=rf"^rank 2: {bad} \(ranks 2, 3 refuse their settings\)$"):
        decide(machine(ranks))
    # Even where the fast path could not run anyway (no GPU): the setting is the error.
    with pytest.raises(ValueError, match="^rank 0: "):
        decide(machine([RankInfo("cpu0", settings_error=bad)]))
    assert decide(machine(ranks), "torch") == (False, "prefer='torch'")  # gathers nothing


def test_debug_on_some_ranks_only_raises_on_every_rank():
    """FAST_ULYSSES_DEBUG=1 makes each call start with a collective: set on some ranks only, the
    ranks would wait for each other, so the gathered topology refuses it (every rank raises)."""
    ranks = [gpu(i, debug=i in (0, 2)) for i in range(4)]
    for prefer in ("auto", "fast"):
        with pytest.raises(
            ValueError,
            match=r"^FAST_ULYSSES_DEBUG=1 on ranks 0, 2 but not on "
            r"ranks 1, 3: set it the same on every rank",
        ):
            decide(machine(ranks), prefer)
    one = [gpu(i, debug=i == 3) for i in range(4)]
    with pytest.raises(ValueError, match=r"=1 on rank 3 but not on ranks 0-2:"):
        decide(machine(one))
    assert decide(machine([gpu(i, debug=True) for i in range(4)]))[0] is True
    assert decide(machine([gpu(i) for i in range(4)]))[0] is True


def test_the_probe_reports_the_debug_switch(monkeypatch):
    monkeypatch.setenv("FAST_ULYSSES_DEBUG", "1")
    assert topology_probe.local_rank_info().debug is True
    monkeypatch.setenv("FAST_ULYSSES_DEBUG", "0")
    assert topology_probe.local_rank_info().debug is False


def test_a_refused_setting_is_reported_by_the_probe_not_raised(monkeypatch):
    monkeypatch.setenv("FAST_ULYSSES_ALLOW_SHARED_GPU", "1")
    monkeypatch.setenv("FAST_ULYSSES_EAGER_GRAPHS", "maybe")
    info = topology_probe.local_rank_info()
    assert info.settings_error.startswith("FAST_ULYSSES_EAGER_GRAPHS=maybe: must be 0"), info
    assert not info.allow_shared_gpu  # (not read once a setting is refused: it may be the one)
    monkeypatch.setenv("FAST_ULYSSES_EAGER_GRAPHS", "1")
    info = topology_probe.local_rank_info()
    assert info.settings_error == "" and info.allow_shared_gpu


def test_the_opt_in_is_read_from_the_environment(monkeypatch):
    monkeypatch.delenv("FAST_ULYSSES_ALLOW_SHARED_GPU", raising=False)
    assert not topology_probe.local_rank_info().allow_shared_gpu
    monkeypatch.setenv("FAST_ULYSSES_ALLOW_SHARED_GPU", "0")
    assert not topology_probe.env_allows_shared_gpu()
    monkeypatch.setenv("FAST_ULYSSES_ALLOW_SHARED_GPU", "yes")
    with pytest.raises(ValueError, match="FAST_ULYSSES_ALLOW_SHARED_GPU=yes: must be 0 .* or 1"):
        topology_probe.env_allows_shared_gpu()
    monkeypatch.setenv("FAST_ULYSSES_ALLOW_SHARED_GPU", "1")
    assert topology_probe.env_allows_shared_gpu()
    assert topology_probe.local_rank_info().allow_shared_gpu


def test_a_pair_that_cannot_map_falls_back_naming_it():
    broken = {(2, 5): PairInfo(2, 5, False, "pcie", "SYS")}
    use_fast, reason = decide(machine(dgx(), overrides=broken))
    assert not use_fast
    assert "rank 2 (0000:12:00.0) and rank 5 (0000:15:00.0)" in reason
    assert "cannot map" in reason
    with pytest.raises(ValueError, match="cannot map"):
        decide(machine(dgx(), overrides=broken), prefer="fast")


def test_a_missing_pair_reads_as_unmappable():
    assert decide(Topology(tuple(dgx(2)), ()))[0] is False


def test_more_than_eight_ranks_fall_back():
    ranks = [gpu(i) for i in range(9)]
    use_fast, reason = decide(machine(ranks))
    assert not use_fast and "9 ranks" in reason and "at most 8" in reason
    with pytest.raises(ValueError, match="at most 8"):
        decide(machine(ranks), prefer="fast")


def test_no_gpu_and_missing_cuda_part():
    cpu = [RankInfo(hostname="node0"), RankInfo(hostname="node0")]
    assert decide(machine(cpu)) == (False, "no GPU on rank 0")
    with pytest.raises(ValueError, match="no GPU on rank 0"):
        decide(machine(cpu), prefer="fast")
    ranks = [gpu(0), gpu(1, cuda_load_error="fast_ulysses._cuda failed to load: libcudart")]
    use_fast, reason = decide(machine(ranks))
    assert not use_fast and "did not load on rank 1" in reason


def test_prefer():
    pcie = machine([gpu(i, socket=i // 4) for i in range(8)], "pcie", path="SYS")
    assert decide(machine(dgx()), prefer="torch") == (False, "prefer='torch'")
    use_fast, reason = decide(pcie, prefer="fast")
    assert use_fast and reason.startswith("prefer='fast'") and "CPU sockets" in reason
    with pytest.raises(ValueError, match="prefer is 'nccl'"):
        decide(machine(dgx()), prefer="nccl")
    with pytest.raises(ValueError, match="no ranks"):
        decide(Topology(()))


def test_spans_sockets():
    assert spans_sockets(machine(dgx()))
    assert not spans_sockets(machine(dgx()[:4]))


def test_probes_without_a_gpu():
    assert topology_probe.parse_cpulist("0-3,8,x,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert topology_probe.normalize_bus_id("00000000:1A:00.0") == "0000:1a:00.0"
    assert topology_probe.sysfs_numa_node("ffff:ff:ff.9") is None
    if topology_probe.visible_gpu_count() == 0:
        info = topology_probe.local_rank_info()
        assert not info.has_gpu and info.hostname


def test_make_group_on_cpu_falls_back(world1):
    if topology_probe.visible_gpu_count() == 0:  # with a GPU, world1 may get the fast group
        group = factory.make_group(world1, 1 << 20)
        assert isinstance(group, TorchUlyssesGroup) and group.fallback
        assert group.fallback_reason == "no GPU on rank 0"
        with pytest.raises(ValueError, match="no GPU on rank 0"):
            factory.make_group(world1, 0, prefer="fast")
    torch_group = factory.make_group(world1, 0, prefer="torch")
    assert torch_group.fallback_reason == "prefer='torch'"
    with pytest.raises(ValueError, match="prefer is 'gpu'"):
        factory.make_group(world1, 0, prefer="gpu")


def test_make_group_builds_the_fast_group_where_decide_says_so(world1, monkeypatch):
    built = []

    class FakeUlyssesGroup:
        fallback = False
        fallback_reason = ""

        def __init__(
            self, process_group, initial_pool_bytes, *, require_nvlink, decision, topology
        ):
            # make_group hands over its decision and the topology it judged, and leaves the
            # links to that decision (no NVLink requirement of the group's own)
            assert decision.use_fast and topology == machine(dgx()) and require_nvlink is False
            built.append((process_group, initial_pool_bytes))

    fake = types.ModuleType("fast_ulysses.group")
    fake.UlyssesGroup = FakeUlyssesGroup
    monkeypatch.setitem(sys.modules, "fast_ulysses.group", fake)
    monkeypatch.setattr(factory, "gather_topology", lambda pg: machine(dgx()))
    group = factory.make_group(world1, 123)
    assert isinstance(group, FakeUlyssesGroup) and built == [(world1, 123)]
    assert group.fallback is False and group.fallback_reason == ""
    monkeypatch.setattr(
        factory,
        "gather_topology",
        lambda pg: machine([gpu(i, socket=i // 4) for i in range(8)], "pcie"),
    )
    fallback = factory.make_group(world1, 123)
    assert isinstance(fallback, TorchUlyssesGroup)
    assert "CPU sockets 0 and 1" in fallback.fallback_reason


def test_each_group_refuses_a_decision_for_the_other(world1):
    from fast_ulysses.topology import Decision

    with pytest.raises(ValueError, match="decision for the fast group"):
        TorchUlyssesGroup(world1, 0, decision=Decision(True, "prefer='fast'"))
    group = TorchUlyssesGroup(world1, 0, decision=Decision(False, "no GPU on rank 0"))
    assert group.fallback_reason == "no GPU on rank 0"
    assert TorchUlyssesGroup(world1, 0).fallback_reason == "requested"
