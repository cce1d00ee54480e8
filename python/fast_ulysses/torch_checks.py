"""`TorchUlyssesGroup`'s checks of one call: the per-call agreement across ranks (the call check,
or the debug check), this rank's own rules (entry point, plan, device, tags, `out=`), and the
group state they update (the tags' windows), as the mixin `CallChecks`."""

from __future__ import annotations

import torch

from ._ops import _C
from .arguments import check_tag
from .autograd import check_borrowed_grad
from .call import BORROWED, OWNED
from .debug import check_next_call
from .errors import FastUlyssesError
from .plan import Plan
from .tags import check_borrowed_tag, resolve_tag
from .validation import check_barrier, plan_call


class CallChecks:
    """The checks of `TorchUlyssesGroup`'s calls; the group holds the state they read
    (`_call_check`, `_debug`, `_windows`, `_deferred`, `_sealed`, `_calls`, `_destroyed`)."""

    @torch.compiler.disable  # host-side: the checks and their collective stay out of traces
    def _checked(self, call):
        """Checks `call` (a `fast_ulysses.call.Call`, entry OWNED or BORROWED; with
        FAST_ULYSSES_DEBUG=1 through `check_agreement`; else at P > 1 through the call check,
        `_agree`), records its tag's window, and returns (tag, plan). Raises ValueError (the
        entry points make it a FastUlyssesError)."""
        self._check_alive()
        if self._call_check is not None:
            return self._commit(self._agree(call))
        if not self._debug:
            return self._commit(self._prepare(call))
        if call.entry == OWNED and call.tag is None and isinstance(call.x, torch.Tensor):
            call = call._replace(tag=resolve_tag(None, call.x, call.mode, call.layout))
        prepared = []
        # Every check of `_prepare` runs inside check_agreement's, so that a rank that refuses
        # its own call (its out=, a tag rule) still joins the gather and every rank raises.
        check_next_call(self, call, check_device=lambda _: prepared.append(self._prepare(call)))
        return self._commit(prepared[0])

    def _prepare(self, call):
        """This rank's checks of `call`, with no effect on the group: the entry point's rules,
        the plan, the device rule, the tag rules and `out`. Returns (tag, plan, the tag's new
        window size or None); raises ValueError."""
        x, tag = call.x, call.tag
        if call.entry == BORROWED:
            check_borrowed_tag(tag)
            check_borrowed_grad(x)
            check_barrier(call.barrier)
        else:
            tag = resolve_tag(tag, x, call.mode, call.layout)
        check_tag(tag)
        p = plan_call(
            x,
            self.world_size,
            self.rank,
            call.mode,
            seq_splits=call.seq_splits,
            head_splits=call.head_splits,
            layout=call.layout,
        )
        check_device(x, self._device_types)
        self._use_tag(tag)
        held = self._windows.get(tag, -1)
        window = None
        if p.window_bytes > held:
            window = _C.window_for_call(tag, p.window_bytes, held, self._sealed)
        if call.out is not None:
            check_out(call.out, x, p)
        return tag, p, window

    def _commit(self, prepared) -> tuple[str, Plan]:
        tag, p, window = prepared
        if window is not None:
            self._windows[tag] = window
        return tag, p

    def _agree(self, call):
        """`_prepare` under the call check (`fast_ulysses.call_check.CallCheck.agree`): returns
        its result when every rank makes the same valid call; else raises on every rank."""
        self._calls += 1
        return self._call_check.agree(self._calls, lambda: self._prepare(call), call)

    def _use_tag(self, tag: str) -> None:
        """The fast group's tag rules: at most `limits()["max_tags"]` distinct tags, and none
        deferred by barrier=False before `barrier()` (ValueError, the transport's message)."""
        known = tag in self._windows
        if not known or tag in self._deferred:
            _C.check_tag_use(tag, len(self._windows), known, tag in self._deferred)

    def _check_alive(self) -> None:
        if self._destroyed:
            raise FastUlyssesError(
                "this TorchUlyssesGroup was destroyed: build a new group "
                "with fast_ulysses.make_group"
            )


def device_types(process_group) -> frozenset[str]:
    """The device types the process group's backends move tensors of (gloo: cpu and cuda;
    NCCL: cuda). Never meta: a meta tensor holds no data to send."""
    return frozenset(device.type for device in process_group._device_types) - {"meta"}


def check_device(x: torch.Tensor, device_types: frozenset[str]) -> None:
    """The fallback's device rule: x on a device type its process group moves (the call
    check compares the device type across ranks). FastUlyssesError naming the device."""
    if x.device.type not in device_types:
        raise FastUlyssesError(
            f"x is on {x.device}: this group's process group moves tensors on "
            f"{' or '.join(sorted(device_types))} only (a meta tensor holds no data to send)"
        )


def read_once(splits):
    """Splits given as a one-shot iterable (a generator) read into a list once, so that the
    checks, the plan and the backward all see the same values; None, a list, a tuple, a str
    and anything that is not iterable as given (the plan refuses what is not a sequence of
    ints, under the call check, so every rank learns of it: this never raises)."""
    if splits is None or type(splits) is list or type(splits) is tuple:
        return splits
    if isinstance(splits, (str, bytes)):
        return splits
    try:
        return list(splits)
    except Exception:  # noqa: BLE001 - refused by the plan, on every rank
        return splits


def check_out(out, x: torch.Tensor, p: Plan) -> None:
    """The rules of `out=`, in the fast group's words: a tensor, no autograd, x's device and
    dtype, the call's output shape, contiguous, sharing no bytes with x (FastUlyssesError
    naming the mismatch)."""
    if not isinstance(out, torch.Tensor):
        raise FastUlyssesError(
            f"out is a {type(out).__name__}: it must be a torch.Tensor (or None)"
        )
    if torch.is_grad_enabled() and (x.requires_grad or out.requires_grad):
        which = "an input that requires grad" if x.requires_grad else "an out that requires grad"
        raise FastUlyssesError(
            f"out= with {which}: out= records no backward; call without "
            "out= when gradients are needed"
        )
    if out.device != x.device:
        raise FastUlyssesError(
            f"out is on {out.device} but x is on {x.device}: out must be on x's device"
        )
    if out.dtype != x.dtype:
        raise FastUlyssesError(
            f"out has dtype {out.dtype} but x has {x.dtype}: out must have x's dtype"
        )
    if tuple(out.shape) != p.output_shape:
        raise FastUlyssesError(
            f"out has shape {list(out.shape)} but the call's output is "
            f"{list(p.output_shape)}: out must have the output's shape"
        )
    if not out.is_contiguous():
        raise FastUlyssesError(
            f"out (shape {list(out.shape)}, strides {list(out.stride())}) "
            "is not contiguous: out must be a contiguous tensor"
        )
    # x's span, as the fast path's byte_range: a strided x (a packed view) reaches further than
    # numel elements.
    size = x.element_size()
    x_end = x.data_ptr() + (sum((n - 1) * st for n, st in zip(x.shape, x.stride())) + 1) * size
    if (
        out.numel()
        and x.numel()
        and out.data_ptr() < x_end
        and x.data_ptr() < out.data_ptr() + out.numel() * size
    ):
        raise FastUlyssesError(
            "out overlaps x in memory: the call reads x while it writes out; "
            "pass an out that shares no bytes with x"
        )
