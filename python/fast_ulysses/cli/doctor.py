"""`fast-ulysses doctor`: what this machine offers the fast path, and the verdict make_group would
reach for a group of every visible GPU (one rank per GPU). With --ulysses-degree U, also the
(ring, ulysses) layout `fast_ulysses.usp_mesh(U)` builds: which ranks form each Ulysses group and
each ring, and whether each Ulysses group lies within one node (torchrun's numbering: node k
holds ranks k*N .. k*N+N-1 for N ranks per node). Exits 0 even with no GPU or driver;
2, with the reason, when a FAST_ULYSSES_* setting holds a value it cannot take (the switches,
the transport's included, and the watchdog's settings: `fast_ulysses.env.check_switches`), since
the report, or the group it describes, would depend on it, or when the layout's numbers do not
fit (U or N not dividing the world size)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import sys

import torch

from .. import topology_probe
from ..env import check_switches
from ..mesh import spanning_message, standard_layout
from ..topology import decide, spans_sockets
from ..topology_probe import visible_topology
from ._help import HelpFormatter

WATCHED_ENV = ("CUDA_VISIBLE_DEVICES", "NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS")
WATCHED_PREFIXES = ("FAST_ULYSSES_", "TORCH_SYMM_MEM_")


def add_parser(subparsers) -> None:
    """Adds `doctor [--json]` to the `fast-ulysses` subcommands."""
    p = subparsers.add_parser(
        "doctor",
        help="check GPUs, links and the fast path's verdict",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    _arguments(p)
    p.set_defaults(run=run)


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--no-symm-init",
        action="store_true",
        help="do not try a one-rank symmetric-memory rendezvous",
    )
    p.add_argument(
        "--ulysses-degree",
        type=int,
        metavar="U",
        help="also print the (ring, ulysses) layout of fast_ulysses.usp_mesh(U)",
    )
    p.add_argument(
        "--world-size",
        type=int,
        metavar="W",
        help="the layout's world size (default: $WORLD_SIZE, else the visible GPUs, at least 1)",
    )
    p.add_argument(
        "--ranks-per-node",
        type=int,
        metavar="N",
        help="ranks per node (default: $LOCAL_WORLD_SIZE, else the visible GPUs, at least 1)",
    )


def run(args) -> int:
    """Collects the report and prints it (a rich table, or JSON with --json).

    Arguments:
        args: the parsed namespace (json, no_symm_init, ulysses_degree, world_size,
            ranks_per_node).

    Returns:
        0: the report is the result, whatever it says; 2: a switch in the environment has a
        value it cannot take (said on stderr, as a usage error: the report would depend on it),
        or the layout's numbers do not fit.
    """
    try:
        check_switches()
        layout = None
        if getattr(args, "ulysses_degree", None) is not None:
            layout = usp_layout(args.ulysses_degree, args.world_size, args.ranks_per_node)
    except ValueError as error:
        print(f"fast-ulysses doctor: error: {error}", file=sys.stderr)
        return 2
    report = collect(symm_init=not getattr(args, "no_symm_init", False))
    if layout is not None:
        report["usp_layout"] = layout
    if getattr(args, "json", False):
        print(json.dumps(report, indent=2, default=str))
    else:
        render(report)
    return 0


def collect(*, symm_init: bool = True) -> dict:
    """Everything the doctor reports, as JSON-ready data."""
    from .. import _ops

    count = topology_probe.visible_gpu_count()
    topology = visible_topology()
    use_fast, reason = decide(topology, "auto")
    with topology_probe.Nvml() as nvml:
        versions = _versions(nvml)
        nvml_state = "ok" if nvml.ok else nvml.error
    return {
        "gpu_available": count > 0,
        "gpu_count": count,
        "message": "" if count else _no_gpu_message(nvml_state),
        "versions": versions,
        "nvml": nvml_state,
        "gpus": [dataclasses.asdict(info) for info in topology.ranks] if count else [],
        "p2p": [_pair_row(topology, p) for p in topology.all_pairs()] if count else [],
        "spans_sockets": spans_sockets(topology) if count else None,
        "symmetric_memory": _symmetric_memory(count, symm_init),
        "cuda_part": {"loaded": not _ops.cuda_load_error, "error": _ops.cuda_load_error},
        "environment": _environment(),
        "verdict": {
            "use_fast": use_fast,
            "reason": reason,
            "group": f"one rank per visible GPU ({count})" if count else "one CPU rank",
        },
    }


def usp_layout(ulysses_degree: int, world_size=None, ranks_per_node=None) -> dict:
    """The (ring, ulysses) layout of `usp_mesh(ulysses_degree)` on `world_size` ranks of
    `ranks_per_node` each (None: $WORLD_SIZE / $LOCAL_WORLD_SIZE, else the visible GPUs),
    numbered as torchrun numbers nodes, as JSON-ready data: `UspLayout.describe()` plus the
    sizes, `within_nodes` and the error usp_mesh would raise ("" none).

    Raises:
        ValueError (FastUlyssesError) for a degree or a node size that does not divide the
        world size.
    """
    from ..errors import FastUlyssesError

    gpus = max(topology_probe.visible_gpu_count(), 1)
    world = world_size or int(os.environ.get("WORLD_SIZE", gpus))
    per_node = ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", gpus))
    if per_node < 1 or world % per_node:
        raise FastUlyssesError(
            f"--ranks-per-node={per_node}: it must be >= 1 and divide the world size {world}"
        )
    layout = standard_layout(world, ulysses_degree, [f"node {r // per_node}" for r in range(world)])
    message = spanning_message(layout)
    return {
        "world_size": world,
        "ranks_per_node": per_node,
        **layout.describe(),
        "within_nodes": not message,
        "error": message,
    }


def _no_gpu_message(nvml_state: str) -> str:
    driver = "driver found" if nvml_state == "ok" else f"no driver ({nvml_state})"
    return (
        f"no GPU: torch.cuda.is_available() is False; {driver}. The fast path needs GPUs; "
        "make_group would build TorchUlyssesGroup."
    )


def _versions(nvml: topology_probe.Nvml) -> dict:
    """fast-ulysses, what it was built against, and what this machine runs. What cannot be
    seen reads "none (why)" rather than being left out."""
    from .. import __version__, _build_info

    no_driver = "none (NVML cannot say: see nvml)"
    return {
        "fast_ulysses": __version__,
        "built_for_torch": _build_info.TORCH_VERSION,
        "built_for_cuda": _build_info.TORCH_CUDA_VERSION or "none (CPU-only torch)",
        "built_cuda_toolkit": _build_info.CUDA_TOOLKIT_VERSION,
        "built_cuda_archs": ",".join(f"sm{a}" for a in _build_info.CUDA_ARCHS.split(","))
        + ("" if _build_info.DEVICE_CODE else " (no device code)"),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda or "none (CPU-only torch)",
        "driver": nvml.driver_version() or no_driver,
        "driver_cuda": nvml.cuda_driver_version() or no_driver,
        "nccl": _nccl_version() or "none (torch has no NCCL)",
        "nvshmem": (
            _dist_version("nvidia-nvshmem-cu13")
            or _dist_version("nvidia-nvshmem-cu12")
            or "none (no nvidia-nvshmem package)"
        ),
    }


def _nccl_version() -> str:
    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError):
        return ""
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return ""


def _pair_row(topology, p) -> dict:
    a, b = topology.ranks[p.a], topology.ranks[p.b]
    row = dataclasses.asdict(p)
    row["torch_can_access"] = (
        topology_probe.torch_can_access(a.pci_bus_id, b.pci_bus_id)
        if p.link != "same-device"
        else True
    )
    return row


def _symmetric_memory(count: int, symm_init: bool) -> dict:
    """The symmetric-memory backend for CUDA, and whether a one-rank rendezvous works."""
    out = {"backend": None, "initialises": None, "error": ""}
    if not count:
        out["error"] = "no GPU"
        return out
    try:
        import torch.distributed._symmetric_memory as symm

        out["backend"] = symm.get_backend("cuda")
        if symm_init:
            _one_rank_rendezvous(symm)
            out["initialises"] = True
    except Exception as error:  # noqa: BLE001 - reported, not raised
        out["initialises"] = False if symm_init else None
        out["error"] = f"{type(error).__name__}: {error}"
    return out


def _one_rank_rendezvous(symm) -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        group = dist.group.WORLD
        owned = False
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        group, owned = dist.group.WORLD, True
    try:
        buffer = symm.empty(4096, dtype=torch.uint8, device=f"cuda:{torch.cuda.current_device()}")
        symm.rendezvous(buffer, group.group_name)
        torch.cuda.synchronize()
    finally:
        if owned:
            dist.destroy_process_group()


def _environment() -> dict:
    env = {name: os.environ.get(name) for name in WATCHED_ENV}
    env.update({k: v for k, v in sorted(os.environ.items()) if k.startswith(WATCHED_PREFIXES)})
    return env


def render(report: dict) -> None:
    """Prints the report as rich tables."""
    from rich.console import Console

    console = Console()
    console.print(_key_values("Versions", report["versions"] | {"nvml": report["nvml"]}))
    if report["message"]:
        console.print(f"[bold yellow]{report['message']}[/]")
    else:
        console.print(_gpu_table(report["gpus"]))
        if report["p2p"]:
            console.print(_p2p_table(report["p2p"]))
        console.print(
            f"All visible GPUs as one group span CPU sockets / NUMA nodes: "
            f"{_yes_no(report['spans_sockets'])}"
        )
    console.print(_key_values("Symmetric memory", report["symmetric_memory"]))
    cuda = report["cuda_part"]
    console.print(
        "CUDA part of the extension: "
        + ("loaded" if cuda["loaded"] else f"[red]not loaded[/]: {cuda['error']}")
    )
    console.print(
        _key_values(
            "Environment",
            {k: "(unset)" if v is None else v for k, v in report["environment"].items()},
        )
    )
    if "usp_layout" in report:
        _render_layout(console, report["usp_layout"])
    verdict = report["verdict"]
    choice = "UlyssesGroup (fast)" if verdict["use_fast"] else "TorchUlyssesGroup (fallback)"
    console.print(
        f"[bold]make_group verdict[/] for {verdict['group']}: [bold]{choice}[/]: "
        f"{verdict['reason']}"
    )


def _render_layout(console, layout: dict) -> None:
    from rich.table import Table

    table = Table(
        title=(
            f"USP layout of usp_mesh({layout['ulysses_degree']}): {layout['world_size']} ranks, "
            f"{layout['ranks_per_node']} per node"
        ),
        title_justify="left",
    )
    for column in ("group", "ranks", "nodes", "within one node"):
        table.add_column(column)
    for i, g in enumerate(layout["ulysses_groups"]):
        ranks, nodes = ", ".join(map(str, g["ranks"])), ", ".join(g["nodes"])
        table.add_row(f"Ulysses {i}", ranks, nodes, _yes_no(g["one_node"]))
    for i, g in enumerate(layout["rings"]):
        table.add_row(f"ring {i}", ", ".join(map(str, g["ranks"])), ", ".join(g["nodes"]), "")
    console.print(table)
    if layout["error"]:
        console.print(
            f"[bold red]usp_mesh({layout['ulysses_degree']}) would raise[/]: {layout['error']}"
        )
    else:
        console.print(
            "Every Ulysses group lies within one node; the rings cross nodes over "
            "torch.distributed (NCCL on GPUs)."
        )


def _key_values(title: str, values: dict):
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    for key, value in values.items():
        table.add_row(str(key), "-" if value in (None, "") else str(value))
    return table


def _gpu_table(gpus: list[dict]):
    from rich.table import Table

    table = Table(title="GPUs", title_justify="left")
    for column in ("index", "name", "PCI bus", "NUMA", "socket", "CPU affinity"):
        table.add_column(column)
    for g in gpus:
        table.add_row(
            str(g["gpu_index"]),
            g["gpu_name"],
            g["pci_bus_id"],
            _text(g["numa_node"]),
            _text(g["cpu_socket"]),
            g["cpu_affinity"] or "?",
        )
    return table


def _p2p_table(pairs: list[dict]):
    from rich.table import Table

    table = Table(
        title="P2P (NVML where available; torch.cuda.can_device_access_peer)", title_justify="left"
    )
    for column in ("GPUs", "can map", "link", "PCIe path", "torch can access"):
        table.add_column(column)
    for p in pairs:
        table.add_row(
            f"{p['a']} <-> {p['b']}",
            _yes_no(p["can_map"]),
            p["link"],
            p["pcie_path"] or "?",
            _yes_no(p["torch_can_access"]),
        )
    return table


def _yes_no(value) -> str:
    return "?" if value is None else ("yes" if value else "no")


def _text(value) -> str:
    return "?" if value is None else str(value)


def main(argv: list[str] | None = None) -> int:
    """`python -m fast_ulysses.cli.doctor [--json]`."""
    parser = argparse.ArgumentParser(
        prog="fast-ulysses doctor", description=__doc__, formatter_class=HelpFormatter
    )
    _arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
