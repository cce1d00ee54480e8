"""FastVideo: `all_to_all_4D` (FastVideo uses its global sequence-parallel group; here that is
the `group` keyword, default the default process group), and `patch_fastvideo()` /
`unpatch_fastvideo()` to make FastVideo's own `sequence_model_parallel_all_to_all_4D` path run on
fast-ulysses."""

from __future__ import annotations

import importlib

import torch

from ..errors import FastUlyssesError
from ._common import check_tensor, exchange, mode_for

_MODULE = "fastvideo.distributed.parallel_state"
_NAMES = ("scatter_dim", "gather_dim")
_originals: dict = {}  # attribute of GroupCoordinator -> FastVideo's own, while patched


def all_to_all_4D(
    input_: torch.Tensor, scatter_dim: int = 2, gather_dim: int = 1, *, group=None
) -> torch.Tensor:
    """(bs, seq/P, hc, hs) -> (bs, seq, hc/P, hs) for scatter_dim=2, gather_dim=1; the inverse
    for scatter_dim=1, gather_dim=2. Differentiable. Other pairs raise ValueError."""
    return exchange(input_, scatter_dim, gather_dim, group, names=_NAMES)


def _coordinator_all_to_all_4D(
    self, input_: torch.Tensor, scatter_dim: int = 2, gather_dim: int = 1
) -> torch.Tensor:
    """`GroupCoordinator.all_to_all_4D` under `patch_fastvideo()`: FastVideo's meaning, on
    `group_for(self.device_group)` (the process group FastVideo's own runs on). The input is
    returned unchanged at P = 1, as FastVideo does; the pair and the tensor are checked at every
    P, so a program does not fail only once P > 1."""
    mode_for(scatter_dim, gather_dim, "bshd", _NAMES)
    check_tensor("input_", input_, 4, "it must be a 4-d tensor (bshd)")
    if self.world_size == 1:
        return input_
    return all_to_all_4D(input_, scatter_dim, gather_dim, group=self.device_group)


_OURS = {"all_to_all_4D": _coordinator_all_to_all_4D}


def _coordinator_class():
    try:
        module = importlib.import_module(_MODULE)
    except ImportError as error:
        raise ImportError(
            f"patch_fastvideo needs fastvideo, whose {_MODULE} does not import: {error}"
        ) from error
    cls = getattr(module, "GroupCoordinator", None)
    missing = [name for name in _OURS if not callable(getattr(cls, name, None))]
    if missing:
        raise FastUlyssesError(
            f"{_MODULE}.GroupCoordinator{'' if cls is None else '.' + missing[0]} not found: "
            "patch_fastvideo rebinds it (fastvideo 0.2.1 has it); nothing was changed"
        )
    return cls


def patch_fastvideo() -> list[str]:
    """Makes FastVideo's Ulysses all-to-all run on fast-ulysses: rebinds `all_to_all_4D` of
    FastVideo's `GroupCoordinator` (fastvideo.distributed.parallel_state), the one path that
    `sequence_model_parallel_all_to_all_4D` (however it was imported) and every
    `get_sp_group().all_to_all_4D` call take, so each runs as `all_to_all_4D` on
    `group_for(coordinator.device_group)`: one call of ours per call of FastVideo's, including
    its attention layers' q/k/v concatenated along the batch (one call), instead of FastVideo's
    device communicator (torch's all_to_all_single, or on CUDA its fused helper). Call it
    before or after fastvideo's parallel groups are built; calling it again changes nothing.
    `unpatch_fastvideo()` undoes it.

    Returns:
        The rebound names, as "module.name".

    Raises:
        ImportError if fastvideo's parallel_state module does not import; FastUlyssesError if
        its GroupCoordinator lacks all_to_all_4D (nothing is changed).
    """
    cls = _coordinator_class()
    for name, ours in _OURS.items():
        if cls.__dict__.get(name) is not ours:
            _originals[name] = cls.__dict__.get(name)  # None: inherited
            setattr(cls, name, ours)
    return [f"{_MODULE}.GroupCoordinator.{name}" for name in _OURS]


def unpatch_fastvideo() -> list[str]:
    """Puts FastVideo's own `GroupCoordinator.all_to_all_4D` back where `patch_fastvideo()`
    rebound it.

    Returns:
        The restored names, as "module.name" (none when nothing was patched).
    """
    if not _originals:
        return []
    cls = _coordinator_class()
    restored = []
    for name, original in list(_originals.items()):
        if original is None:
            delattr(cls, name)
        else:
            setattr(cls, name, original)
        restored.append(f"{_MODULE}.GroupCoordinator.{name}")
        del _originals[name]
    return restored
