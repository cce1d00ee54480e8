"""What `UlyssesGroup` checks: once, at construction (the topology's decision, NVLink, ranks
sharing a GPU; a collected group's release), and on every call (liveness, the tensor, the tag,
and with FAST_ULYSSES_DEBUG=1 the ranks' agreement), as the mixin `FastCallChecks`. The op
checks the rest of a call itself, in C++."""

from __future__ import annotations

import os
import warnings

import torch
import torch.distributed as dist

from ._ops import ops
from .arguments import check_tag
from .debug import check_next_call
from .errors import FastUlyssesError
from .topology import Decision, decide, shared_gpu_pair
from .upstream_options import nvlink_refusal

_warned_shared_gpu = False


class FastCallChecks:
    """`UlyssesGroup`'s checks of one call; the group holds the state they read (`_destroyed`,
    `_debug`, `_calls`, `process_group`, `group_name`)."""

    def _check_live(self) -> None:
        if self._destroyed:
            raise FastUlyssesError("this UlyssesGroup was destroyed: create a new one")

    def _before_call(self, call) -> None:
        """This rank's checks of `call` (a `fast_ulysses.call.Call`) before the op's own: with
        FAST_ULYSSES_DEBUG=1, every rank's call against every other rank's."""
        if self._destroyed:
            self._check_live()  # raises
        if self._debug:  # every rank learns of every rank's problem: all raise, none waits
            check_next_call(self, call, check_device=lambda t: self._check_tensor(t, device=True))
        else:  # (the common case costs two type checks)
            if type(call.x) is not torch.Tensor:
                self._check_tensor(call.x)
            tag = call.tag
            if type(tag) is not str or not tag:
                check_tag(tag)

    def _check_tensor(self, x, *, device: bool = False) -> None:
        # The op checks the rest itself (device, shape, dtype), in C++; the debug path asks the
        # group's C++ device rule first, so that every rank learns of it before anything is sent.
        if not isinstance(x, torch.Tensor):
            raise FastUlyssesError(f"x is a {type(x).__name__}: it must be a torch.Tensor")
        if device:
            ops.check_device(self.group_name, x)


_unforgotten: list[str] = []  # groups collected during a CUDA-graph capture


def forget(key: str) -> None:
    """A collected group's finalizer: `forget_group` drains the device, which a capture forbids,
    so a group collected during one is forgotten at the next group's construction instead."""
    if torch.cuda.is_current_stream_capturing():
        _unforgotten.append(key)
        return
    forget_collected()
    ops.forget_group(key)


def forget_collected() -> None:
    """Releases the groups collected during a capture (`forget` deferred them); call it outside
    any capture."""
    while _unforgotten:
        ops.forget_group(_unforgotten.pop())


def check_decision(
    group: dist.ProcessGroup,
    device: torch.device,
    decision: Decision | None,
    topology,
    require_nvlink: bool,
) -> None:
    """Refuses what the transport cannot serve, judged on one topology gathered over the group,
    so every rank reaches the same verdict (a rank raising alone would leave its peers waiting in
    the collective rendezvous)."""
    if (decision is None) != (topology is None):
        raise FastUlyssesError(
            "UlyssesGroup takes decision and topology together (make_group passes both) or neither"
        )
    if decision is None:
        from .topology_probe import gather_topology

        with torch.cuda.device(device):
            topology = gather_topology(group)
        decision = decide(topology, "fast")  # raises where the fast path cannot run
    if not decision.use_fast:
        raise FastUlyssesError(
            f"UlyssesGroup was handed a decision for the fallback "
            f"({decision.reason!r}): build TorchUlyssesGroup, or call make_group"
        )
    refusal = nvlink_refusal(topology) if require_nvlink else ""
    if refusal:
        raise FastUlyssesError(refusal)
    if shared_gpu_pair(topology) is not None:
        _allow_shared_gpu()


def _allow_shared_gpu() -> None:
    global _warned_shared_gpu
    # torch's CUDA symmetric memory refuses overlapping devices unless told otherwise.
    os.environ["TORCH_SYMM_MEM_ALLOW_OVERLAPPING_DEVICES"] = "1"
    if not _warned_shared_gpu:
        _warned_shared_gpu = True
        warnings.warn(
            "fast-ulysses: ranks share a GPU (FAST_ULYSSES_ALLOW_SHARED_GPU=1): a "
            "testing mode; results are correct, timings are not NVLink timings",
            stacklevel=3,
        )
