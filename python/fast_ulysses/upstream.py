"""The upstream project's names, for code written against it (SGLang diffusion, vLLM-Omni,
LightX2V and others call them).

Every name here is a thin name over this package's own entry points: the groups'
`all_to_all_single_4d`, its borrowed form, `barrier()` and `qk_norm_rope_all_to_all_qk`. There
is one transport and one route; nothing here moves a byte itself. Where this package is stricter
by design, the error names what the upstream did and the fix. docs/API.md, "Migrating from the
upstream API", maps every name.

`UpstreamNames` is mixed into both groups, so code written against the upstream runs on the
fast group and on the torch fallback alike. The constructor options and the module-level names
(`supports_world_size`, `nvlink_matrix`, `norm_rope`, ...) are in `upstream_options`.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from .arguments import as_splits
from .errors import FastUlyssesError
from .fused import qk_norm_rope_all_to_all_qk
from .plan import cached_plan
from .plan import plan as make_plan
from .upstream_options import check_use_tma, on_device, qk_norm, rope_style

#: How many results `all_to_all_4d_async(lend=True)` may keep alive at once.
LEND_WINDOWS = 4


class CompletedTensor(torch.Tensor):
    """An async call's result that is ready already (at P = 1, into a buffer of the caller's):
    the result itself, with the `.wait()` of an AsyncCollectiveTensor (it returns the plain
    tensor). Ops on it return plain tensors. (Wrapping it in an AsyncCollectiveTensor instead
    cost about 70 us of host time a call on an H100.)"""

    __torch_function__ = torch._C._disabled_torch_function_impl

    def wait(self) -> torch.Tensor:
        return self.as_subclass(torch.Tensor)


def _as_async(result: torch.Tensor) -> torch.Tensor:
    """`result` with a `.wait()`: an AsyncCollectiveTensor where the transfer is in flight (its
    first use or wait() makes the stream wait), else a CompletedTensor."""
    if isinstance(result, funcol.AsyncCollectiveTensor):
        return result
    if torch.compiler.is_compiling():
        return funcol._maybe_wrap_tensor(result)
    return result.as_subclass(CompletedTensor)


def _window(result: torch.Tensor) -> torch.Tensor:
    """The plain tensor a borrowed result views, without waiting (an AsyncCollectiveTensor
    wraps it and has no storage of its own)."""
    return result.elem if isinstance(result, funcol.AsyncCollectiveTensor) else result


def _ready(result: torch.Tensor) -> torch.Tensor:
    """`result` as a plain tensor the caller's stream may read (waits on the device)."""
    return result.wait() if isinstance(result, funcol.AsyncCollectiveTensor) else result


class AsyncHandle:
    """What `all_to_all_single_4d_async` returns: `wait()` makes the current stream wait for
    the transfer (on the device) and returns the result, a view of the tag's window valid until
    the next call with that tag."""

    def __init__(self, group, result: torch.Tensor, deferred: bool):
        self._group = group
        self._result = result
        self._closed_at = group._barriers + 1 if deferred else None

    def wait(self) -> torch.Tensor:
        if self._closed_at is not None and self._group._barriers < self._closed_at:
            raise FastUlyssesError(
                "wait() on an all_to_all_single_4d_async(barrier=False) result before the "
                "barrier that closes it: the upstream let this wait order only this rank's "
                "work, so the peers' data might not have landed; here it raises. Issue the "
                "layer's last call with barrier=True, or call signal_arrive_async() and "
                "signal_wait(), then wait()"
            )
        return _ready(self._result)


class UpstreamNames:
    """The upstream's methods, on top of the group's own (mixed into both groups)."""

    _barriers = 0  # barrier() calls so far (each group's barrier() counts them)
    _deferred_open = False  # an async call with barrier=False awaits its barrier
    _arrived = False  # signal_arrive_async() awaits its signal_wait()

    # -- the upstream v0.2 surface ---------------------------------------------------------

    def all_to_all_4d(
        self,
        x,
        mode=0,
        *,
        out=None,
        seq_splits=None,
        head_splits=None,
        wire_dtype=None,
        dequantize=True,
    ):
        """`all_to_all_single_4d(x, mode, out=out, ...)` (bshd, tag chosen by the tag rule).
        With an `out` from `empty_output()` the peers write into it directly (no copy-out);
        with wire_dtype (`fast_ulysses.wire`) the dequantize writes it."""
        wire = dict(wire_dtype=wire_dtype, dequantize=dequantize)
        tag = self._output_tag(out) if wire_dtype is None else None
        if tag is None:
            return self.all_to_all_single_4d(
                x, mode, None, seq_splits=seq_splits, head_splits=head_splits, out=out, **wire
            )
        _ready(self._into_output(x, mode, out, tag, seq_splits, head_splits))
        return out

    def all_to_all_4d_async(
        self, x, mode=0, *, out=None, seq_splits=None, head_splits=None, lend=False
    ):
        """`all_to_all_4d` whose result has a `.wait()`: an AsyncCollectiveTensor where the
        transfer is in flight (its wait, or its first use, makes the stream wait), a
        CompletedTensor where it is ready already. lend=True returns one of `LEND_WINDOWS`
        windows of the group in rotation (no copy-out); one more alive at once raises."""
        if type(lend) is not bool:
            raise FastUlyssesError(f"lend={lend!r}: it must be True or False")
        if lend:
            if out is not None:
                raise FastUlyssesError(
                    "out= with lend=True: a lent result is a window of the group itself; "
                    "pass out= (your buffer) or lend=True, not both"
                )
            return _as_async(self._lend(x, mode, seq_splits, head_splits))
        tag = self._output_tag(out)
        if tag is not None:
            return _as_async(self._into_output(x, mode, out, tag, seq_splits, head_splits))
        return _as_async(
            self.all_to_all_single_4d(
                x, mode, None, seq_splits=seq_splits, head_splits=head_splits, out=out
            )
        )

    def empty_output(self, x, mode=0, *, seq_splits=None, head_splits=None):
        """A buffer of the call's output shape and x's dtype, for `out=`: on the fast group a
        window of its own, which the peers write directly (collective: it is made by one
        all-to-all of x, whose result it holds; valid until the group's destroy()), on the
        fallback a plain tensor. The next call into it overwrites it."""
        if self.fallback:
            shape = self._output_shape(x, mode, seq_splits, head_splits)
            return torch.empty(shape, dtype=x.dtype, device=x.device)
        outputs = self.__dict__.setdefault("_output_tags", {})
        tag = f"fast_ulysses.output.{len(outputs)}"
        with torch.no_grad():
            buffer = _ready(
                self.all_to_all_single_4d_borrowed(
                    x, mode, tag, seq_splits=seq_splits, head_splits=head_splits
                )
            )
        outputs[buffer.data_ptr()] = tag
        return buffer

    def allocate_output(self, x, mode=0):
        """`empty_output(x, mode=mode)` (the upstream's earlier name)."""
        return self.empty_output(x, mode)

    def unsupported_reason(self, shape, dtype, mode=0) -> str | None:
        """Why this rank's input of `shape` and `dtype` cannot go through `all_to_all_4d` with
        even splits (the plan's message), or None. Not collective."""
        try:
            make_plan(self.world_size, self.rank, mode, shape, dtype)
        except ValueError as error:
            return str(error)
        return None

    @classmethod
    def create(cls, process_group=None, device=None, **options):
        """The group, or None on every rank (with a RuntimeWarning saying why) where it cannot be
        built on some rank. Collective: the ranks vote before any of them builds."""
        if not dist.is_initialized():
            warnings.warn(
                "fast-ulysses is unavailable: torch.distributed is not initialized",
                RuntimeWarning,
                stacklevel=2,
            )
            return None
        blockers = [None] * dist.get_world_size(process_group)
        blocker = cls._local_blocker(device)
        with on_device(None if blocker else device):  # (NCCL gathers on the current device)
            dist.all_gather_object(blockers, blocker, group=process_group)
        why = "; ".join(f"rank {r}: {b}" for r, b in enumerate(blockers) if b)
        if not why:
            try:
                if device is not None:
                    options["device"] = device
                return cls(process_group, **options)
            except RuntimeError as error:  # every refusal (FastUlyssesError is one)
                why = str(error)
        warnings.warn(f"fast-ulysses is unavailable: {why}", RuntimeWarning, stacklevel=2)
        return None

    @property
    def stream(self):
        """The stream calls are ordered on: the caller's current stream (any stream works;
        None on a fallback group without CUDA)."""
        device = getattr(self, "device", None)
        if device is None or not torch.cuda.is_available():
            return None
        return torch.cuda.current_stream(device)

    # -- the older names -------------------------------------------------------------------

    def all_to_all_single_4d_ce(self, x, mode=0, tag=None, **options):
        """`all_to_all_single_4d`: every call here takes the copy engines."""
        return self.all_to_all_single_4d(x, mode, tag, **options)

    def all_to_all_single_4d_async(self, x, mode=0, tag=None, *, use_tma=None, barrier=True):
        """The borrowed call on `tag`, as an `AsyncHandle`. barrier=False leaves the closing
        handshake to a later barrier=True call (or signal_arrive_async()), which then closes
        every call left open, with one barrier()."""
        check_use_tma(use_tma)
        if type(barrier) is not bool:
            raise FastUlyssesError(f"barrier={barrier!r}: it must be True or False")
        closes_others = barrier and self._deferred_open
        result = self.all_to_all_single_4d_borrowed(
            x, mode, tag, barrier=not closes_others and barrier
        )
        if closes_others:
            self.barrier()
        elif not barrier:
            self._deferred_open = True
        return AsyncHandle(self, result, deferred=not barrier)

    def all_to_all_single_4d_ce_async(self, x, mode=0, tag=None, *, barrier=True):
        """`all_to_all_single_4d_async`."""
        return self.all_to_all_single_4d_async(x, mode, tag, barrier=barrier)

    def signal_arrive_async(self) -> None:
        """Closes every call left open by barrier=False (`barrier()`, on the current stream)."""
        self.barrier()
        self._arrived = True

    def signal_wait(self) -> None:
        """Pairs with `signal_arrive_async()`, which already ordered the current stream after
        the peers' data; raises when no arrive is pending (as the upstream does)."""
        if not self._arrived:
            raise FastUlyssesError(
                "signal_wait() before signal_arrive_async(): call signal_arrive_async() first"
            )
        self._arrived = False

    def all_to_all_single_4d_qk2(
        self,
        q,
        k,
        weight_q,
        weight_k,
        cos,
        sin,
        *,
        mode="cross_head",
        interleaved=True,
        eps=1e-6,
        tag="",
        use_tma=None,
    ):
        """RMSNorm + RoPE + the mode-0 scatter of q and k with one closing handshake
        (`fast_ulysses.qk_norm_rope_all_to_all_qk` on tags `tag + "::q"` and `tag + "::k"`):
        (q_out, k_out), borrowed results valid until the next call with their tags."""
        check_use_tma(use_tma)
        return qk_norm_rope_all_to_all_qk(
            self,
            q,
            k,
            (f"{tag}::q", f"{tag}::k"),
            norm_weights=(weight_q, weight_k),
            eps=eps,
            cos=cos,
            sin=sin,
            norm=qk_norm(mode),
            rope_style=rope_style(interleaved),
        )

    # -- helpers ---------------------------------------------------------------------------

    def _output_shape(self, x, mode, seq_splits, head_splits) -> tuple:
        if not isinstance(x, torch.Tensor):
            raise FastUlyssesError(f"x is a {type(x).__name__}: it must be a torch.Tensor")
        seq, heads = as_splits(seq_splits, "seq_splits"), as_splits(head_splits, "head_splits")
        return cached_plan(
            self.world_size,
            self.rank,
            mode,
            tuple(x.shape),
            x.element_size(),
            None if seq is None else tuple(seq),
            None if heads is None else tuple(heads),
            "bshd",
        ).output_shape

    def _output_tag(self, out) -> str | None:
        """The tag of an `empty_output` buffer of this group, or None."""
        outputs = self.__dict__.get("_output_tags")
        if not outputs or not isinstance(out, torch.Tensor):
            return None
        return outputs.get(_window(out).data_ptr())

    def _into_output(self, x, mode, out, tag, seq_splits, head_splits):
        """The borrowed call on the tag whose window `out` is: the peers write into `out`."""
        if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
            raise FastUlyssesError(
                "out= with an input that requires grad: out= records no backward; call "
                "without out= when gradients are needed"
            )
        if not isinstance(x, torch.Tensor):
            raise FastUlyssesError(f"x is a {type(x).__name__}: it must be a torch.Tensor")
        seq = None if seq_splits is None else tuple(seq_splits)
        heads = None if head_splits is None else tuple(head_splits)
        checked = self.__dict__.setdefault("_output_calls", set())
        call = (tag, tuple(x.shape), x.dtype, mode, seq, heads)
        if call not in checked:  # (once per geometry: the check is the plan's)
            shape = self._output_shape(x, mode, seq, heads)
            if tuple(out.shape) != shape or out.dtype != x.dtype:
                raise FastUlyssesError(
                    f"out has shape {tuple(out.shape)} and dtype {out.dtype}, but this call's "
                    f"output is {shape} of {x.dtype}: an empty_output() buffer serves calls of "
                    "its own shape and dtype (make one per call geometry)"
                )
            checked.add(call)
        seq_splits, head_splits = seq, heads
        result = self.all_to_all_single_4d_borrowed(
            x, mode, tag, seq_splits=seq_splits, head_splits=head_splits
        )
        if _window(result).data_ptr() != out.data_ptr():  # a window stays while large enough
            raise RuntimeError(f"fast-ulysses: the window of {tag!r} moved: please report this")
        return result

    def _lend(self, x, mode, seq_splits, head_splits):
        """The borrowed call on the next of the `LEND_WINDOWS` lend tags, in rotation, refused
        while any tensor still holds that window's previous result (`_LentWindow`)."""
        lent = self.__dict__.setdefault("_lent", [None] * LEND_WINDOWS)
        count = self.__dict__.get("_lends", 0)
        slot = count % LEND_WINDOWS
        if lent[slot] is not None and lent[slot].alive():
            raise FastUlyssesError(
                f"all_to_all_4d_async(lend=True): the next lend reuses window {slot} of "
                f"{LEND_WINDOWS}, whose result from {LEND_WINDOWS} lends ago is still held (by "
                "it, a view, a detach() or .data of it): drop those first, or call with "
                "lend=False (a result you own). Every rank must drop lent results at the same "
                "point of its program (a rank refusing alone leaves its peers waiting in the call)"
            )
        result = self.all_to_all_single_4d_borrowed(
            x, mode, f"fast_ulysses.lend.{slot}", seq_splits=seq_splits, head_splits=head_splits
        )
        lent[slot] = _LentWindow(_window(result), pool_owned=not self.fallback)
        self._lends = count + 1
        return result


class _LentWindow:
    """Whether any tensor still uses a lent result's memory: its storage's count of users
    beyond the owners that are not tensors (every view, detach() and .data shares the storage,
    and a window is a storage of its own). Holds the storage, never a tensor. The owners: this
    record, and on the fast group the window's own handle in the pool. (Counted as constants,
    not read at the call: a reference the call leaves behind for a while, a collective's work
    say, would otherwise raise the bar and let a held result's window be reused.)"""

    def __init__(self, result: torch.Tensor, pool_owned: bool):
        self._storage = result.untyped_storage()
        self._others = 2 if pool_owned else 1

    def _users(self) -> int:
        return torch._C._storage_Use_Count(self._storage._cdata)

    def alive(self) -> bool:
        return self._users() > self._others
