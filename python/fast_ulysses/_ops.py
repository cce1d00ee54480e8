"""Loads the native libraries. `_C` (plan, Meta kernels) must load; `_cuda` (the transport) may
fail on a build or machine without a usable CUDA runtime, and `cuda_load_error` says why.

Both are compiled against one torch release, recorded by the build in `_build_info`. Under any
other torch the libraries are not loaded at all (they would fail on undefined symbols, or
worse): `import fast_ulysses` raises an ImportError naming both versions and how to rebuild.
"""

from __future__ import annotations

import importlib

import torch  # (loads libtorch before our libraries)

REBUILD = (
    "rebuild fast-ulysses under the installed torch: pip install --no-build-isolation "
    "--no-deps --force-reinstall <a fast-ulysses sdist or source checkout> "
    "(docs/INSTALL.md)"
)


def _release(version: str) -> str:
    """ "2.11.0+cu130" -> "2.11.0": the torch release, without the local build label."""
    return str(version).split("+", 1)[0]


def _major(cuda_version: str | None) -> str:
    return (cuda_version or "").split(".", 1)[0]


def _describe(torch_version: str, cuda_version: str | None) -> str:
    return f"torch {torch_version} ({f'CUDA {cuda_version}' if cuda_version else 'CPU-only'})"


def torch_mismatch(
    built_torch: str, built_cuda: str, torch_version: str, cuda_version: str | None
) -> str:
    """Why the libraries built against `built_torch` cannot load under `torch_version` ("" when
    they can: the same torch release; the local label, e.g. +cu130, may differ)."""
    if _release(built_torch) == _release(torch_version):
        return ""
    return (
        f"fast_ulysses was built against {_describe(built_torch, built_cuda)}, but "
        f"{_describe(torch_version, cuda_version)} is installed: its compiled extension "
        f"loads only under the torch release it was built for. Either install "
        f"torch=={_release(built_torch)}, or {REBUILD}."
    )


def cuda_mismatch(built_cuda: str, torch_version: str, cuda_version: str | None) -> str:
    """Why the CUDA part built for `built_cuda` cannot load under `torch_version` with
    `cuda_version` ("" when it can: the same CUDA major version)."""
    if not built_cuda or _major(built_cuda) == _major(cuda_version):
        return ""
    have = f"CUDA {cuda_version}" if cuda_version else "no CUDA (a CPU-only build)"
    return (
        f"the CUDA part of fast_ulysses was built for CUDA {built_cuda}, but the installed "
        f"torch {torch_version} has {have}; the CPU part (plan, simulate, the torch "
        f"fallback) works. For the fast path, install a torch built for CUDA "
        f"{_major(built_cuda)}.x, or {REBUILD}."
    )


try:
    from . import _build_info
except ImportError as error:
    raise ImportError(
        f"fast_ulysses has no _build_info module ({error}): this copy was never "
        f"built. Install it with pip (docs/INSTALL.md) rather than importing the "
        f"source tree."
    ) from error

_problem = torch_mismatch(
    _build_info.TORCH_VERSION, _build_info.TORCH_CUDA_VERSION, torch.__version__, torch.version.cuda
)
if _problem:
    raise ImportError(_problem)

try:
    # Registers torch.ops.fast_ulysses.*; the module holds the rules and constants Python asks
    # about (csrc/ops/module_c.cpp): `from ._ops import _C`.
    from . import _C  # noqa: F401  (loaded for its op registrations)
except ImportError as error:
    raise ImportError(
        f"fast_ulysses._C failed to load under torch {torch.__version__} (built "
        f"against torch {_build_info.TORCH_VERSION}): {error}. If this torch is "
        f"not the one fast-ulysses was built with, {REBUILD}."
    ) from error

cuda_load_error: str = cuda_mismatch(
    _build_info.TORCH_CUDA_VERSION, torch.__version__, torch.version.cuda
)
# The CUDA part's module (None where it did not load): its functions `owned` and `borrowed` are
# UlyssesGroup's eager way into the collectives (csrc/ops/fast_entry.cpp).
cuda_module = None
if not cuda_load_error:
    try:
        cuda_module = importlib.import_module("fast_ulysses._cuda")
    except ImportError as error:  # pragma: no cover - depends on the build
        cuda_load_error = f"fast_ulysses._cuda failed to load: {error}"

ops = torch.ops.fast_ulysses


def cuda_available() -> bool:
    """True when the CUDA transport library loaded (a GPU may still be absent)."""
    return not cuda_load_error
