"""Where a group's ranks sit, as plain data: one `RankInfo` per rank, one `PairInfo` per pair.

Three modules, one direction of imports: this one holds the types (it imports nothing of the
package); `hardware` probes this machine and gathers a group's `Topology` (torch.cuda, NVML,
sysfs); `policy` judges a `Topology` (pure functions, which tests feed synthetic machines).
"""

from __future__ import annotations

from dataclasses import dataclass

# Link of a pair: NVLink, PCIe, one GPU shared by both ranks, no link (different nodes or no
# GPU), or unknown (no NVML to ask; not trusted to be NVLink).
LINKS = ("nvlink", "pcie", "same-device", "none", "unknown")


@dataclass(frozen=True)
class RankInfo:
    """What one rank reports about itself.

    Arguments:
        hostname: the node's name (ranks on one node must agree).
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
