"""The upstream project's constructor options and module-level names (`fast_ulysses.upstream`
holds the methods it mixes into both groups): the group sizes and dtypes it supports, its
`device` / `require_nvlink` / `backend` / `use_tma` options, `nvlink_matrix` and `norm_rope`.
Each is checked or answered by this package's own rules (docs/API.md, "Migrating from the
upstream API")."""

from __future__ import annotations

import torch

from .errors import FastUlyssesError
from .fused import norm_rope_reference
from .plan import _element_size, limits

#: Every group size one group takes (the plan's limit: one node, odd sizes included).
SUPPORTED_WORLD_SIZES = tuple(range(1, limits()["max_world_size"] + 1))
#: The transports `UlyssesGroup(backend=...)` takes: the one this package implements.
BACKENDS = ("pitched",)
#: The upstream's qk norm names and ours (fast_ulysses.fused: norm=).
QK_NORMS = {"cross_head": "all_heads", "per_head": "per_head"}


def supports_world_size(world_size) -> bool:
    """True for a group size a group takes (`SUPPORTED_WORLD_SIZES`)."""
    return type(world_size) is int and world_size in SUPPORTED_WORLD_SIZES


def supports_dtype(dtype) -> bool:
    """True for a torch.dtype the all-to-alls move (the groups' own rule: any 1-, 2- or 4-byte
    dtype that is not complex or bool); False for anything else."""
    if not isinstance(dtype, torch.dtype):
        return False
    try:
        _element_size(dtype)
    except FastUlyssesError:
        return False
    return True


def check_backend(backend) -> None:
    """Refuses, naming it, a `backend` this package does not implement."""
    if isinstance(backend, str) and backend in BACKENDS:
        return
    raise FastUlyssesError(
        f"backend={backend!r}: fast-ulysses implements one transport, 'pitched' (pitched "
        "copy-engine writes straight into the peers' windows); the upstream's 'packed' (flat "
        "copies with a local pack and unpack, for PCIe) is not implemented: pass "
        "backend='pitched', or use fast_ulysses.make_group(), which picks the torch.distributed "
        "path where the pitched one would lose"
    )


def as_device(device) -> torch.device:
    """`device` (a torch.device, a str such as "cuda:1", or a CUDA device index) as a
    torch.device."""
    try:
        if type(device) is int:
            if device < 0:
                raise RuntimeError("negative index")
            return torch.device("cuda", device)
        return torch.device(device)
    except (TypeError, RuntimeError):
        raise FastUlyssesError(
            f"device={device!r}: it must be a torch.device, a str such as 'cuda:1', a CUDA "
            "device index or None"
        ) from None


def is_device_argument(value) -> bool:
    """A torch.device, or a str naming a CUDA device: what the upstream passes second, where
    the groups take initial_pool_bytes (an int there stays bytes)."""
    return isinstance(value, torch.device) or (isinstance(value, str) and value.startswith("cuda"))


def check_upstream_options(device, require_nvlink, backend) -> None:
    """The constructor options both groups take: `device` (None or `as_device`'s),
    `require_nvlink` (a bool) and `backend` (`check_backend`)."""
    check_backend(backend)
    if type(require_nvlink) is not bool:
        raise FastUlyssesError(f"require_nvlink={require_nvlink!r}: it must be True or False")
    if device is not None:
        as_device(device)


def check_use_tma(use_tma) -> None:
    """`use_tma` (the upstream's kernel choice) must be None or a bool. There is one transport
    here, copy engines and no kernel, so the choice has nothing to pick: it is accepted so that
    code written for the upstream runs, and every value takes the same path."""
    if use_tma is not None and type(use_tma) is not bool:
        raise FastUlyssesError(f"use_tma={use_tma!r}: it must be None, True or False")


def nvlink_refusal(topology) -> str:
    """Why `UlyssesGroup(require_nvlink=True)` refuses `topology` ("" when it does not): a pair
    of ranks on two GPUs whose link is known and is not NVLink. Ranks sharing one GPU, and pairs
    NVML cannot judge, pass (the upstream's rule)."""
    for pair in topology.all_pairs():
        if pair.link in ("nvlink", "same-device", "unknown"):
            continue
        a, b = topology.ranks[pair.a], topology.ranks[pair.b]
        return (
            f"require_nvlink=True: ranks {pair.a} ({a.label(pair.a)}) and {pair.b} "
            f"({b.label(pair.b)}) are joined by {pair.link}, not NVLink; pass "
            "require_nvlink=False to build the group anyway, or use fast_ulysses.make_group() "
            "(`fast-ulysses doctor` shows the links)"
        )
    return ""


def nvlink_matrix(devices) -> dict | None:
    """Which pairs of this process's CUDA devices are NVLink-joined (a direct link, or both on
    an NVSwitch fabric), by NVML: {(i, j): bool} over every ordered pair of `devices` (indices),
    (i, i) True. None where NVML cannot answer. Not collective."""
    from .topology_probe import Nvml, bus_id_of

    devices = [int(d) for d in devices]
    with Nvml() as nvml:
        if not nvml.ok:
            return None
        buses = {d: bus_id_of(d) for d in devices}
        matrix = {}
        for i in devices:
            for j in devices:
                if i == j:
                    matrix[(i, j)] = True
                    continue
                probed = nvml.p2p(buses[i], buses[j])
                if probed is None:
                    return None
                matrix[(i, j)] = probed[1] == "nvlink"
    return matrix


def norm_rope(x, weight, cos, sin, *, mode="per_head", interleaved=True, eps=1e-6):
    """RMSNorm then RoPE on this rank's (b, s, N, d) tensor, with no all-to-all: the math of the
    fused scatter (`fast_ulysses.fused.norm_rope_reference`, which the kernel is tested against).
    mode "per_head" (weight (d,)) or "cross_head" (one RMS over a token's N*d values, weight
    (N*d,)); interleaved=True rotates pairs (x[2i], x[2i+1]), False (x[i], x[i+d/2])."""
    return norm_rope_reference(
        x, weight, eps, cos, sin, norm=qk_norm(mode), rope_style=rope_style(interleaved)
    )


def qk_norm(mode) -> str:
    if isinstance(mode, str) and mode in QK_NORMS:
        return QK_NORMS[mode]
    raise FastUlyssesError(
        f"mode={mode!r}: must be 'cross_head' (one RMS over a token's N*d values) or "
        "'per_head' (one RMS per head)"
    )


def rope_style(interleaved) -> str:
    if type(interleaved) is not bool:
        raise FastUlyssesError(f"interleaved={interleaved!r}: it must be True or False")
    return "interleaved" if interleaved else "half"


def on_device(device):
    """`torch.cuda.device(device)` for a CUDA device, else a context that does nothing."""
    import contextlib

    if device is None or not torch.cuda.is_available():
        return contextlib.nullcontext()
    device = as_device(device)
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
