"""Probes of the GPUs this process can see (torch.cuda, NVML via `pynvml` from nvidia-ml-py, and
sysfs), and the `Topology` of a group (`gather_topology`) or of this machine
(`visible_topology`). Everything degrades to "unknown" instead of raising: a machine with no GPU,
no driver or no NVML still gets a `RankInfo` (and doctor a report).

Kept apart from `topology` (the types and the decision on them), which this module fills and
never judges: the rules stay pure functions that tests feed synthetic machines, and only this
module touches the machine.

NVML is asked about pairs because it sees every GPU of the node whatever CUDA_VISIBLE_DEVICES
says (a rank often sees only its own); torch.cuda.can_device_access_peer is the fallback, for
GPUs this process sees.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch

from .env import DEBUG_ENV, SHARED_GPU_ENV, settings_error, switch
from .topology import PairInfo, RankInfo, Topology

_SYS = Path("/sys")
# nvmlDeviceGetTopologyCommonAncestor values, by the names `nvidia-smi topo -m` prints.
_PATH_NAMES = {0: "SAME", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def node_name() -> str:
    """This process's node: the host name, plus "#<GROUP_RANK>" where torchrun set GROUP_RANK
    (its node rank). On real nodes the host names differ anyway; the node rank tells apart two
    torchrun "nodes" started on one machine (`torchrun --nnodes 2` twice, or the tests' simulated
    nodes), which share no fast path: ranks of different nodes never map each other's memory."""
    host = socket.gethostname()
    group_rank = os.environ.get("GROUP_RANK", "")
    return f"{host}#{group_rank}" if group_rank else host


def env_allows_shared_gpu() -> bool:
    """True when this process set FAST_ULYSSES_ALLOW_SHARED_GPU=1."""
    return switch(SHARED_GPU_ENV)


def visible_gpu_count() -> int:
    """CUDA devices this process sees; 0 without a GPU or driver."""
    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except RuntimeError:
        return 0


def local_rank_info(index: int | None = None) -> RankInfo:
    """This process's `RankInfo` for CUDA device `index` (None: the current device).

    Arguments:
        index: a visible CUDA device index, or None.

    Returns:
        The RankInfo; without a visible GPU only hostname, cuda_load_error and
        allow_shared_gpu are filled.
    """
    from ._ops import cuda_load_error

    # A refused setting is reported, not raised: every rank of the gather raises for it
    # (topology.decide), none alone. (The shared-GPU switch is then not read: it may be the one.)
    refused = settings_error()
    base = dict(
        hostname=node_name(),
        cuda_load_error=cuda_load_error,
        allow_shared_gpu=not refused and env_allows_shared_gpu(),
        settings_error=refused,
        debug=not refused and switch(DEBUG_ENV),
    )
    if visible_gpu_count() == 0:
        return RankInfo(**base)
    if index is None:
        index = torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    bus = bus_id_of(index)
    numa = sysfs_numa_node(bus)
    cpus = sysfs_local_cpulist(bus) or _node_cpulist(numa)
    return RankInfo(
        gpu_index=index,
        gpu_name=props.name,
        pci_bus_id=bus,
        uuid=str(getattr(props, "uuid", "")).removeprefix("GPU-"),
        numa_node=numa,
        cpu_socket=socket_of_cpulist(cpus),
        cpu_affinity=cpus,
        **base,
    )


def bus_id_of(index: int) -> str:
    """The PCI bus id of visible CUDA device `index`, sysfs form "0000:18:00.0"."""
    p = torch.cuda.get_device_properties(index)
    return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"


def normalize_bus_id(bus: str) -> str:
    """NVML's "00000000:18:00.0" (or any domain width) in sysfs form "0000:18:00.0"."""
    domain, _, rest = bus.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}" if rest else bus.lower()


def sysfs_numa_node(bus: str) -> int | None:
    """The NUMA node sysfs gives the PCI device; None where unknown (sysfs says -1)."""
    value = _read(_SYS / "bus/pci/devices" / bus / "numa_node")
    try:
        node = int(value)
    except ValueError:
        return None
    return node if node >= 0 else None


def sysfs_local_cpulist(bus: str) -> str:
    """The CPUs close to the PCI device, as a cpulist ("0-55,112-167"); "" unknown."""
    return _read(_SYS / "bus/pci/devices" / bus / "local_cpulist")


def socket_of_cpulist(cpulist: str) -> int | None:
    """The physical package (CPU socket) of the first CPU of `cpulist`; None unknown."""
    cpus = parse_cpulist(cpulist)
    if not cpus:
        return None
    value = _read(_SYS / f"devices/system/cpu/cpu{cpus[0]}/topology/physical_package_id")
    try:
        return int(value)
    except ValueError:
        return None


def parse_cpulist(cpulist: str) -> list[int]:
    """ "0-3,8" -> [0, 1, 2, 3, 8]; malformed parts are skipped."""
    cpus: list[int] = []
    for part in cpulist.strip().split(","):
        lo, _, hi = part.partition("-")
        try:
            cpus.extend(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            continue
    return cpus


def torch_can_access(bus_a: str, bus_b: str) -> bool | None:
    """torch.cuda.can_device_access_peer for two GPUs by bus id; None if either is not visible."""
    index = {bus_id_of(i): i for i in range(visible_gpu_count())}
    if bus_a not in index or bus_b not in index:
        return None
    return bool(torch.cuda.can_device_access_peer(index[bus_a], index[bus_b]))


def pair_info(infos: list[RankInfo], a: int, b: int, nvml: Nvml) -> PairInfo:
    """How the GPUs of ranks a and b reach each other: NVML first, then torch."""
    ra, rb = infos[a], infos[b]
    if not (ra.has_gpu and rb.has_gpu) or ra.hostname != rb.hostname:
        return PairInfo(a, b, can_map=False, link="none")
    if ra.gpu_key == rb.gpu_key:
        return PairInfo(a, b, can_map=True, link="same-device")
    probed = nvml.p2p(ra.pci_bus_id, rb.pci_bus_id)
    if probed is not None:
        can_map, link, path = probed
        return PairInfo(a, b, can_map=can_map, link=link, pcie_path=path)
    return PairInfo(
        a, b, can_map=bool(torch_can_access(ra.pci_bus_id, rb.pci_bus_id)), link="unknown"
    )


def gather_topology(process_group=None) -> Topology:
    """Builds the group's topology; collective: every rank of `process_group` calls it.

    Each rank probes its own GPU (torch.cuda, NVML, sysfs) and the pairs it leads (with every
    higher rank, by NVML, else torch.cuda.can_device_access_peer); both are all-gathered, so
    every rank returns the same Topology.

    Arguments:
        process_group: the group (None: the default group).

    Returns:
        The `Topology`, ranks in group order.
    """
    import torch.distributed as dist

    rank = dist.get_rank(process_group)
    size = dist.get_world_size(process_group)
    infos: list = [None] * size
    dist.all_gather_object(infos, local_rank_info(), group=process_group)
    with Nvml() as nvml:
        mine = [pair_info(infos, rank, b, nvml) for b in range(rank + 1, size)]
    rows: list = [None] * size
    dist.all_gather_object(rows, mine, group=process_group)
    return Topology(tuple(infos), tuple(p for row in rows for p in row))


def visible_topology() -> Topology:
    """The topology of one rank per GPU this process sees (what `doctor` judges)."""
    infos = [local_rank_info(i) for i in range(visible_gpu_count())]
    with Nvml() as nvml:
        pairs = [
            pair_info(infos, a, b, nvml)
            for a in range(len(infos))
            for b in range(a + 1, len(infos))
        ]
    if not infos:
        infos = [local_rank_info()]
    return Topology(tuple(infos), tuple(pairs))


class Nvml:
    """NVML for the duration of a `with` block; `ok` False (and `error` why) where it is not
    available, in which case every query returns None."""

    def __init__(self):
        self.ok = False
        self.error = ""
        self._nvml = None

    def __enter__(self) -> Nvml:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as error:  # noqa: BLE001 - missing library, no driver, ...
            self.error = f"{type(error).__name__}: {error}"
            return self
        self._nvml, self.ok = pynvml, True
        return self

    def __exit__(self, *exc) -> None:
        if self.ok:
            try:
                self._nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down; nothing to report
                pass
            self.ok = False

    def p2p(self, bus_a: str, bus_b: str):
        """(can_map, "nvlink"|"pcie", pcie_path) for two GPUs, None if NVML cannot say."""
        if not self.ok:
            return None
        n = self._nvml
        try:
            ha = n.nvmlDeviceGetHandleByPciBusId(bus_a)
            hb = n.nvmlDeviceGetHandleByPciBusId(bus_b)
            ok = n.NVML_P2P_STATUS_OK
            read = n.nvmlDeviceGetP2PStatus(ha, hb, n.NVML_P2P_CAPS_INDEX_READ) == ok
            nvlink = n.nvmlDeviceGetP2PStatus(
                ha, hb, n.NVML_P2P_CAPS_INDEX_NVLINK
            ) == ok or self._nvlink_to(ha, bus_b)
            path = _PATH_NAMES.get(int(n.nvmlDeviceGetTopologyCommonAncestor(ha, hb)), "")
        except n.NVMLError:
            return None
        return read, "nvlink" if nvlink else "pcie", path

    def _nvlink_to(self, handle, bus: str) -> bool:
        """A direct NVLink (bridge) from `handle` to the GPU at `bus`; NVSwitch systems answer
        through the P2P NVLINK status instead, as their links end at the switch."""
        n = self._nvml
        for link in range(getattr(n, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if n.nvmlDeviceGetNvLinkState(handle, link) != n.NVML_FEATURE_ENABLED:
                    continue
                remote = n.nvmlDeviceGetNvLinkRemotePciInfo(handle, link)
            except n.NVMLError:
                continue
            if normalize_bus_id(_text(remote.busId)) == bus:
                return True
        return False

    def driver_version(self) -> str:
        """The driver version ("580.159.04"), "" if NVML cannot say."""
        if not self.ok:
            return ""
        try:
            return _text(self._nvml.nvmlSystemGetDriverVersion())
        except self._nvml.NVMLError:
            return ""

    def cuda_driver_version(self) -> str:
        """The CUDA version the driver supports ("13.0"), "" if NVML cannot say."""
        if not self.ok:
            return ""
        try:
            v = int(self._nvml.nvmlSystemGetCudaDriverVersion())
        except self._nvml.NVMLError:
            return ""
        return f"{v // 1000}.{v % 1000 // 10}"


def _node_cpulist(node: int | None) -> str:
    if node is None:
        return ""
    return _read(_SYS / f"devices/system/node/node{node}/cpulist")


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
