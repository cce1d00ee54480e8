"""Worker-side torch.profiler helpers: which kernels a piece of code launched on the GPU.

Used by graph_correctness.py (no kernel of ours on the copy path) and fused_correctness.py
(which fused kernel a call took). Profile on one rank only: with four or more processes
profiling one GPU at once, CUPTI left some of them with no device activity at all.
"""

from __future__ import annotations

import os

import torch

# Device activities that are not kernels launched by anyone's code.
NOT_KERNELS = ("Memcpy", "Memset", "Runtime Triggered Module Loading", "Lazy Function Loading")


def device_activity(prof) -> list[str]:
    """Names of the device-side (CUDA) activities the profiler recorded."""
    from torch.autograd import DeviceType

    try:
        return [
            e.name()
            for e in prof.profiler.kineto_results.events()
            if e.device_type() == DeviceType.CUDA
        ]
    except AttributeError:
        return [e.name for e in prof.events() if e.device_type == DeviceType.CUDA]


def kernel_names(prof) -> list[str]:
    """The kernels among device_activity(prof)."""
    return [nm for nm in device_activity(prof) if not nm.startswith(NOT_KERNELS)]


def activities() -> list:
    return [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]


def init_profiler_for_graphs(device) -> None:
    """The profiler beside CUDA graphs: CUPTI torn down after a profile breaks later captures,
    so initialize CUPTI before any capture and never tear it down (TEARDOWN_CUPTI=0 must be
    set before the first use)."""
    os.environ.setdefault("TEARDOWN_CUPTI", "0")
    with torch.profiler.profile(activities=activities()):
        torch.ones(1, device=device).add_(1)
        torch.cuda.synchronize()
