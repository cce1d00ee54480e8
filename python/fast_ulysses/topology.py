"""Where a group's ranks sit, and what `make_group` does about it: one module for the decision.

The topology, as plain data: one `RankInfo` per rank, one `PairInfo` per pair, in a `Topology`.
The decision: whether the fast path can run, and whether it pays, on a `Topology` (`decide`, a
pure function of plain data, so tests feed it synthetic machines). `make_group` asks `decide`
once and hands the frozen `Decision` to the group it builds; a `UlyssesGroup` built directly asks
`decide` with prefer="fast", so the same rule refuses with the same words whichever way a user
comes in. Probing this machine (torch.cuda, NVML, sysfs) to fill a `Topology` is kept apart, in
`topology_probe` (it imports this module; nothing here probes), so the rules read without it.

Why these rules: the fast path writes straight into peers' memory, so it needs one node, a GPU per
rank that maps every other rank's memory, and the CUDA part of the extension; ranks sharing one
GPU are a test set-up, so they need an explicit opt-in on every rank. It loses where peer writes
cross the inter-socket link of a PCIe machine (NCCL stages those through host memory better).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .env import DEBUG_ENV, SHARED_GPU_ENV
from .errors import FastUlyssesError
from .plan import limits

# -- the topology ------------------------------------------------------------------------------

# Link of a pair: NVLink, PCIe, one GPU shared by both ranks, no link (different nodes or no
# GPU), or unknown (no NVML to ask; not trusted to be NVLink).
LINKS = ("nvlink", "pcie", "same-device", "none", "unknown")


@dataclass(frozen=True)
class RankInfo:
    """What one rank reports about itself.

    Arguments:
        hostname: the rank's node (`topology_probe.node_name`: the host name, plus "#<node rank>"
            under torchrun), equal for ranks of one node.
        gpu_index: the CUDA device index in the rank's process, None without a GPU.
        gpu_name: e.g. "NVIDIA H200".
        pci_bus_id: "0000:18:00.0" (sysfs form); "" unknown.
        uuid: the GPU's UUID without the "GPU-" prefix; "" unknown.
        numa_node: the GPU's NUMA node, None unknown.
        cpu_socket: the CPU socket (physical package) the GPU hangs off, None unknown.
        cpu_affinity: the GPU's local CPUs as a cpulist ("0-55,112-167"); "" unknown.
        cuda_load_error: fast_ulysses._ops.cuda_load_error on the rank ("" loaded).
        allow_shared_gpu: the rank set FAST_ULYSSES_ALLOW_SHARED_GPU=1.
        settings_error: why one of the rank's FAST_ULYSSES_* settings was refused ("" none).
        debug: the rank set FAST_ULYSSES_DEBUG=1 (every rank must agree: each call is then
            checked collectively).
    """

    hostname: str
    gpu_index: int | None = None
    gpu_name: str = ""
    pci_bus_id: str = ""
    uuid: str = ""
    numa_node: int | None = None
    cpu_socket: int | None = None
    cpu_affinity: str = ""
    cuda_load_error: str = ""
    allow_shared_gpu: bool = False
    settings_error: str = ""
    debug: bool = False

    @property
    def has_gpu(self) -> bool:
        return self.gpu_index is not None

    @property
    def gpu_key(self) -> tuple:
        """What identifies the GPU: two ranks with equal keys share one device."""
        return (self.hostname, self.uuid or self.pci_bus_id or self.gpu_index)

    def label(self, rank: int) -> str:
        where = self.pci_bus_id or (f"cuda:{self.gpu_index}" if self.has_gpu else "no GPU")
        return f"rank {rank} ({where})"


@dataclass(frozen=True)
class PairInfo:
    """How the GPUs of ranks `a` < `b` reach each other.

    Arguments:
        a, b: the ranks.
        can_map: each can map the other's memory (CUDA P2P).
        link: one of LINKS.
        pcie_path: NVML's common ancestor of the two ("PIX", "PXB", "PHB", "NODE", "SYS"; SYS
            crosses the inter-socket link); "" unknown or not PCIe.
    """

    a: int
    b: int
    can_map: bool
    link: str
    pcie_path: str = ""


@dataclass(frozen=True)
class Topology:
    """A group: `ranks[r]` is rank r; `pairs` holds each pair a < b (a missing pair reads as
    unknown and unmappable)."""

    ranks: tuple[RankInfo, ...]
    pairs: tuple[PairInfo, ...] = ()

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def pair(self, a: int, b: int) -> PairInfo:
        lo, hi = min(a, b), max(a, b)
        for p in self.pairs:
            if (p.a, p.b) == (lo, hi):
                return p
        return PairInfo(lo, hi, can_map=False, link="unknown")

    def all_pairs(self):
        n = self.world_size
        return [self.pair(a, b) for a in range(n) for b in range(a + 1, n)]


def spans_sockets(t: Topology) -> bool:
    """True when the ranks' GPUs sit on more than one known CPU socket or NUMA node."""
    sockets = {i.cpu_socket for i in t.ranks if i.cpu_socket is not None}
    numa = {i.numa_node for i in t.ranks if i.numa_node is not None}
    return len(sockets) > 1 or len(numa) > 1


def shared_gpu_pair(t: Topology):
    """The first two ranks (a, b) that share one GPU, or None."""
    seen: dict = {}
    for r, info in enumerate(t.ranks):
        if info.gpu_key in seen:
            return seen[info.gpu_key], r
        seen[info.gpu_key] = r
    return None


# -- the decision ------------------------------------------------------------------------------

MAX_RANKS = limits()["max_world_size"]  # csrc/plan/plan.h's kMaxWorldSize, the one definition
PREFERENCES = ("auto", "fast", "torch")


class Decision(NamedTuple):
    """Which group `make_group` builds, and why: frozen, made once, handed to the group.

    Arguments:
        use_fast: build `UlyssesGroup` (else `TorchUlyssesGroup`).
        reason: the rule behind it, naming ranks, GPUs, sockets or nodes (never empty).
    """

    use_fast: bool
    reason: str


def check_prefer(prefer: str) -> None:
    """Raises ValueError unless `prefer` is one of PREFERENCES."""
    if prefer not in PREFERENCES:
        raise FastUlyssesError(f"prefer is {prefer!r}: it must be one of 'auto', 'fast', 'torch'")


def decide(topology: Topology | None, prefer: str = "auto") -> Decision:
    """Whether `make_group` builds the fast group for `topology`, and why.

    Arguments:
        topology: the group's `Topology` (may be None only with prefer="torch").
        prefer: "auto" (fast unless a rule below says it loses or cannot run), "fast" (fast
            wherever it can run) or "torch" (always the fallback).

    Returns:
        A `Decision` (use_fast, reason); the reason names the ranks, GPUs, sockets or nodes
        behind it.

    Raises:
        ValueError for a bad `prefer`, an empty topology, a FAST_ULYSSES_* setting refused on
        any rank or FAST_ULYSSES_DEBUG=1 on some ranks only (`settings_message`, whatever
        `prefer` but "torch"), or prefer="fast" where the fast path cannot run (no GPU, CUDA
        part missing, > 8 ranks, several nodes, ranks sharing a GPU without the opt-in, a pair
        without P2P): `cannot_run_message`.
    """
    check_prefer(prefer)
    if prefer == "torch":
        return Decision(False, "prefer='torch'")
    if topology is None or topology.world_size == 0:
        raise FastUlyssesError("the topology has no ranks")
    refused = settings_message(topology)
    if refused:  # a typo is never a reason to fall back: every rank raises it
        raise FastUlyssesError(refused)
    blocker = cannot_run_reason(topology)
    if blocker:
        if prefer == "fast":
            raise FastUlyssesError(cannot_run_message(blocker))
        return Decision(False, blocker)
    loser = loses_reason(topology)
    if prefer == "fast":
        return Decision(
            True, "prefer='fast'" + (f" (auto would fall back: {loser})" if loser else "")
        )
    if loser:
        return Decision(False, loser)
    return Decision(True, _fast_summary(topology))


def settings_message(t: Topology) -> str:
    """The error for FAST_ULYSSES_* settings refused on some ranks (the first rank's message,
    and which ranks), or for FAST_ULYSSES_DEBUG on some ranks only (with it, each call starts
    with a collective that ranks without it never join: they would wait for each other); ""
    when every rank's settings parse and agree."""
    return agreement_message(
        [info.debug for info in t.ranks], [info.settings_error for info in t.ranks]
    )


def agreement_message(debug: Sequence[bool], errors: Sequence[str]) -> str:
    """The error for settings refused on some ranks (`errors[r]`: rank r's parser message, ""
    if none; the first rank's message, and which ranks), or for FAST_ULYSSES_DEBUG=1 on some
    ranks only (`debug[r]`: rank r has it); "" when every rank's settings parse and agree. Both
    groups ask it: `settings_message` for the topology, and `TorchUlyssesGroup` for the debug
    setting alone (make_group(prefer="torch") and a direct build gather no topology)."""
    bad = [r for r, error in enumerate(errors) if error]
    if bad:
        which = f" (ranks {_ranks_text(bad)} refuse their settings)" if len(bad) > 1 else ""
        return f"rank {bad[0]}: {errors[bad[0]]}{which}"
    on = [r for r, flag in enumerate(debug) if flag]
    if on and len(on) < len(debug):
        off = [r for r, flag in enumerate(debug) if not flag]
        return (
            f"{DEBUG_ENV}=1 on {_rank_list(on)} but not on {_rank_list(off)}: set it the "
            f"same on every rank (each call of a group built with it first checks every "
            f"rank's call collectively, which ranks without it never join)"
        )
    return ""


def cannot_run_message(blocker: str) -> str:
    """The one error for a fast group that cannot run: prefer="fast" or a direct UlyssesGroup."""
    return (
        f"the fast path cannot run here: {blocker} (make_group() falls back to TorchUlyssesGroup)"
    )


def cannot_run_reason(t: Topology) -> str:
    """Why the fast path cannot run on `t` at all; "" if it can. Several nodes come first: that
    stays true whatever each node's GPUs are (and a CPU rank's report says so too)."""
    hosts = _ranks_by(t, lambda info: info.hostname)
    if len(hosts) > 1:
        where = "; ".join(f"{h}: ranks {_ranks_text(rs)}" for h, rs in hosts.items())
        return (
            f"the group spans {len(hosts)} nodes ({where}): the fast path is one node only "
            "(past a node, keep each Ulysses group within a node and run the ring across "
            "nodes: fast_ulysses.usp_mesh)"
        )
    for r, info in enumerate(t.ranks):
        if not info.has_gpu:
            return f"no GPU on rank {r}"
    for r, info in enumerate(t.ranks):
        if info.cuda_load_error:
            return f"the extension's CUDA part did not load on rank {r}: {info.cuda_load_error}"
    if t.world_size > MAX_RANKS:
        return (
            f"the group has {t.world_size} ranks: at most {MAX_RANKS} (one node), for the "
            "fallback too (make_group raises)"
        )
    shared = shared_gpu_pair(t)
    if shared and not all(info.allow_shared_gpu for info in t.ranks):
        a, b = shared
        return (
            f"ranks {a} and {b} share one GPU ({t.ranks[a].label(a)}): set "
            f"{SHARED_GPU_ENV}=1 on every rank to use the fast path anyway (a test set-up: "
            "correct, but not NVLink speed)"
        )
    unmappable = [p for p in t.all_pairs() if not p.can_map and p.link != "same-device"]
    if unmappable:
        p = unmappable[0]
        more = f" (and {len(unmappable) - 1} more pairs)" if len(unmappable) > 1 else ""
        return (
            f"the GPUs of {t.ranks[p.a].label(p.a)} and {t.ranks[p.b].label(p.b)} cannot "
            f"map each other's memory (no P2P, link {p.link}){more}"
        )
    return ""


def loses_reason(t: Topology) -> str:
    """Why the fast path would run but lose on `t`; "" if not."""
    slow = [p for p in t.all_pairs() if p.link not in ("nvlink", "same-device")]
    for rule in (_across_sockets, _across_numa, _across_sys_path):
        for p in slow:
            reason = rule(t.ranks[p.a], t.ranks[p.b], p)
            if reason:
                return reason
    return ""


def _across_sockets(ra: RankInfo, rb: RankInfo, p: PairInfo) -> str:
    if not _differ(ra.cpu_socket, rb.cpu_socket):
        return ""
    return (
        f"the group's GPUs span CPU sockets {ra.cpu_socket} and {rb.cpu_socket} over "
        f"{_over(p)} ({ra.label(p.a)} and {rb.label(p.b)}): peer writes would cross the "
        "inter-socket link"
    )


def _across_numa(ra: RankInfo, rb: RankInfo, p: PairInfo) -> str:
    if not _differ(ra.numa_node, rb.numa_node):
        return ""
    return (
        f"the group's GPUs span NUMA nodes {ra.numa_node} and {rb.numa_node} over "
        f"{_over(p)} ({ra.label(p.a)} and {rb.label(p.b)}): peer writes would cross NUMA "
        "nodes"
    )


def _across_sys_path(ra: RankInfo, rb: RankInfo, p: PairInfo) -> str:
    if p.pcie_path != "SYS":
        return ""
    return (
        f"the PCIe path between {ra.label(p.a)} and {rb.label(p.b)} crosses the "
        "inter-socket link (NVML: SYS): peer writes would cross CPU sockets"
    )


def _over(p: PairInfo) -> str:
    return "PCIe" if p.link == "pcie" else f"a link not known to be NVLink ({p.link})"


def _ranks_by(t: Topology, key) -> dict:
    groups: dict = {}
    for r, info in enumerate(t.ranks):
        groups.setdefault(key(info), []).append(r)
    return groups


def _rank_list(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_ranks_text(ranks)}"


def _ranks_text(ranks: list[int]) -> str:
    if ranks == list(range(ranks[0], ranks[-1] + 1)) and len(ranks) > 2:
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(map(str, ranks))


def _differ(a, b) -> bool:
    return a is not None and b is not None and a != b


def _fast_summary(t: Topology) -> str:
    links = sorted({p.link for p in t.all_pairs()})
    if not links:
        return "one rank on one GPU"
    return f"{t.world_size} ranks on one node, links: {', '.join(links)}"
