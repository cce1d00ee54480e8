"""What diffusers' context parallelism needs to run on CPU ranks over gloo, none of it on the
all-to-all path: `cpu_shims()` applies each shim only where needed (`patch_diffusers` calls
it), `unshim()` undoes them (`unpatch_diffusers`)."""

from __future__ import annotations

import functools
import importlib

import torch
import torch.distributed as dist

_MISSING = object()
_shimmed: list = []  # (owner, attribute, what it held or _MISSING), while the CPU shims are on


def _set(owner, name: str, value) -> None:
    """setattr, remembered so that `unshim` puts back what `owner` held."""
    _shimmed.append((owner, name, vars(owner).get(name, _MISSING)))
    setattr(owner, name, value)


def unshim() -> None:
    while _shimmed:
        owner, name, original = _shimmed.pop()
        if original is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, original)


def _one_device() -> int:
    return 1


def _warning_once(logger):
    """transformers' Logger.warning_once for one logger: each message once."""
    seen = set()

    def warning_once(msg, *args, **kwargs):
        if msg not in seen:
            seen.add(msg)
            logger.warning(msg, *args, **kwargs)

    return warning_once


def _padded_all_gather_anything(original, tensor: torch.Tensor, dim: int, group) -> torch.Tensor:
    """diffusers' `_all_gather_anything` (its ulysses_anything sharder's output gather) where
    gloo takes it: a CPU tensor is padded to the largest rank's length, gathered and cut back
    (gloo refuses tensors of unequal sizes, which NCCL accepts); other devices go to diffusers'
    own."""
    if tensor.device.type != "cpu":
        return original(tensor, dim, group)
    parallel = importlib.import_module("diffusers.models._modeling_parallel")
    tensor = tensor.contiguous()
    sizes = parallel.gather_size_by_comm(tensor.shape[dim], group)
    pad = list(tensor.shape)
    pad[dim] = max(sizes) - tensor.shape[dim]
    padded = torch.cat([tensor, tensor.new_zeros(pad)], dim)
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded, group=group)
    return torch.cat([p.narrow(dim, 0, n) for p, n in zip(parts, sizes)], dim)


def cpu_shims() -> None:
    """What diffusers 0.42.1's context parallelism needs to run on CPU ranks over gloo, none of
    it on the all-to-all path; `patch_diffusers` applies each where it is needed and
    `unpatch_diffusers` undoes them:

    - `enable_parallelism` computes `rank % torch.accelerator.device_count()`, a
      ZeroDivisionError in a process without an accelerator: there, device_count() reads 1;
    - its sharder calls `logger.warning_once`, which only transformers' import adds to
      `logging.Logger`: without it, that one logger gets one;
    - `ulysses_anything` gathers the output with `dist.all_gather` of unequal tensors, which
      gloo refuses: CPU tensors are padded to the largest and cut after
      (`_padded_all_gather_anything`)."""
    if _shimmed:
        return
    context_parallel = importlib.import_module("diffusers.hooks.context_parallel")

    if torch.accelerator.device_count() == 0:
        _set(torch.accelerator, "device_count", _one_device)
    logger = getattr(context_parallel, "logger", None)
    if logger is not None and not hasattr(logger, "warning_once"):
        _set(logger, "warning_once", _warning_once(logger))
    original = getattr(context_parallel, "_all_gather_anything", None)
    if original is not None:
        _set(
            context_parallel,
            "_all_gather_anything",
            functools.partial(_padded_all_gather_anything, original),
        )
