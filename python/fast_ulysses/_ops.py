"""Loads the native libraries. `_C` (plan, Meta kernels) must load; `_cuda` (the transport) may
fail on a build or machine without a usable CUDA runtime, and `cuda_load_error` says why."""

from __future__ import annotations

import importlib

import torch  # noqa: F401  (loads libtorch before our libraries)

from . import _C  # noqa: F401  (registers torch.ops.fast_ulysses.*)

cuda_load_error: str = ""
try:
    importlib.import_module("fast_ulysses._cuda")
except ImportError as error:  # pragma: no cover - depends on the build
    cuda_load_error = f"fast_ulysses._cuda failed to load: {error}"

ops = torch.ops.fast_ulysses


def cuda_available() -> bool:
    """True when the CUDA transport library loaded (a GPU may still be absent)."""
    return not cuda_load_error
