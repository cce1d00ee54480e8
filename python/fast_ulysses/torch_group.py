"""`TorchUlyssesGroup`: the fast group's entry points on plain `torch.distributed`.

The fallback `make_group` picks where the fast path would lose (GPUs on different CPU sockets
over PCIe, no P2P, a group spanning nodes) and the reference for tests. It works on any backend
whose `all_to_all_single` takes split sizes: gloo on CPU tensors, NCCL on GPUs.

How one call moves data. Let `split` be the dimension the sender cuts (heads in mode 0,
sequence in mode 1) and `cat` the one the receiver joins (sequence in mode 0, heads in mode 1).
Every chunk travels in the order "cat first, then the other dimensions in layout order", so that
the receive buffer is the output with `cat` moved to the front: a regular tensor whatever the
splits. The sender copies its chunks into that order (one pass over x); the receiver permutes
back (one pass), and skips even that where the permuted view is already contiguous (sbhd mode 0,
or bshd mode 0 with b == 1). Either way the result has waited for the collective (on NCCL a
stream wait, not a host block), so a result that is never used leaves no unwaited work behind.
Bytes travel as uint8, so every 1-, 2- and 4-byte dtype is moved bit for bit.

Before any data moves, every call at P > 1 checks that the ranks agree on it: one small int64
all-gather of what each rank believes the call is (`fast_ulysses.call_check` says what is compared
and when a call is refused). FAST_ULYSSES_CHECK_CALLS=0 turns the check off; with
FAST_ULYSSES_DEBUG=1 the debug check (`fast_ulysses.debug.check_agreement`) runs instead.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from . import wire
from ._ops import _C
from .arguments import as_pool_bytes, check_tag, group_repr
from .autograd import TorchAllToAll, check_borrowed_grad
from .call_check import BORROWED, OWNED, CallCheck, agreed_settings
from .debug import check_agreement
from .errors import FastUlyssesError, public, refused
from .plan import Plan
from .tags import check_borrowed_tag, resolve_tag
from .topology import Decision
from .upstream import (
    UpstreamNames,
    as_device,
    check_upstream_options,
    check_use_tma,
    is_device_argument,
)
from .validation import check_barrier, plan_call, window_bytes_by_tag


class TorchUlyssesGroup(UpstreamNames):
    """The Ulysses all-to-alls on `torch.distributed`: permute, `all_to_all_single` with split
    sizes, permute back. Bit-exact with `UlyssesGroup` and `fast_ulysses.simulate`.

    Arguments:
        process_group: the ranks of the sequence-parallel group (None: the default group).
        initial_pool_bytes: accepted for signature parity with `UlyssesGroup`; unused (>= 0).
        device, require_nvlink, backend: UlyssesGroup's, checked by the same rules
            (`fast_ulysses.upstream.check_upstream_options`), so code written for it builds this
            group unchanged. `device` is kept as `self.device` (None: not given); there are no
            peer mappings here, so there is no link to require; `backend` says what was asked
            for, while `self.backend` is "torch", what runs.
        decision: the `fast_ulysses.topology.Decision` make_group reached (it passes its own);
            its reason becomes `fallback_reason`. None: built directly ("requested").

    Attributes:
        fallback: always True.
        fallback_reason: why it was chosen ("requested" unless `make_group` says otherwise).
        rank, world_size: this rank in the group and the group's size.
        process_group: the group the collectives run on.

    Raises:
        FastUlyssesError (a ValueError) for a process_group that is not a torch.distributed
        ProcessGroup (or None), a decision that is not a Decision (or None); for a group of
        more ranks than
        `fast_ulysses.plan.limits()["max_world_size"]` (8, one node: the plan's rule, for both
        groups), raised here rather than on each call; for a FAST_ULYSSES_* switch this group
        reads that some rank refuses, or that differs across ranks (on every rank).
        RuntimeError when torch.distributed is not initialised.

    Every call at P > 1 first checks that every rank makes the same call (one small
    all-gather; see `fast_ulysses.call_check`), unless FAST_ULYSSES_CHECK_CALLS=0. With
    FAST_ULYSSES_DEBUG=1 set when the group is built, every call is instead checked by
    `fast_ulysses.debug.check_agreement`, as on `UlyssesGroup`. Building the group is
    collective at P > 1: the ranks compare both settings (one all_gather_object), and where
    they differ every rank raises FastUlyssesError (`fast_ulysses.topology.agreement_message`).
    """

    fallback = True
    backend = "torch"
    ring_group = None  # the ring's ProcessGroup where make_group got a mesh or a pair
    rank: int
    world_size: int
    fallback_reason: str

    @staticmethod
    def _local_blocker(device=None) -> str:
        """Nothing stops this group locally (`create()` asks both groups)."""
        return ""

    @public
    def __init__(
        self,
        process_group=None,
        initial_pool_bytes: int = 0,
        *,
        device=None,
        require_nvlink: bool = True,
        backend: str = "pitched",
        decision=None,
    ):
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise FastUlyssesError(
                f"process_group is {process_group!r}: it must be a torch.distributed "
                "ProcessGroup, or None for the default group"
            )
        if decision is not None and not isinstance(decision, Decision):
            raise FastUlyssesError(
                f"decision is {decision!r}: it must be a fast_ulysses.topology.Decision "
                "(make_group passes its own), or None"
            )
        if process_group is None:
            process_group = dist.group.WORLD
        if process_group is None:
            raise RuntimeError(
                "TorchUlyssesGroup needs torch.distributed initialised: call "
                "torch.distributed.init_process_group first"
            )
        if is_device_argument(initial_pool_bytes) and device is None:
            initial_pool_bytes, device = 0, initial_pool_bytes
        as_pool_bytes(initial_pool_bytes)
        check_upstream_options(device, require_nvlink, backend)
        self.device = None if device is None else as_device(device)
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        # The plan's limit holds for this group too: raise here, not on every call.
        _C.check_group(self.world_size, self.rank)
        self.initial_pool_bytes = initial_pool_bytes
        if decision is not None and decision.use_fast:
            raise FastUlyssesError(
                f"TorchUlyssesGroup was handed a decision for the fast group "
                f"({decision.reason!r}): build UlyssesGroup, or call "
                f"make_group"
            )
        self.fallback_reason = "requested" if decision is None else decision.reason
        self._device_types = _device_types(process_group)
        self._destroyed = False
        self._debug, check = agreed_settings(process_group, self.world_size)
        self._calls = 0
        # The call check (the debug check replaces it; one rank cannot disagree with itself).
        self._call_check = None
        if check and not self._debug and self.world_size > 1:
            self._call_check = CallCheck(process_group, self.world_size)
        # The fast group's per-tag rules, applied here too (csrc/plan/tag_rules.h, through the
        # ops), so a program that breaks one fails on a CPU test as it would on the GPU: the
        # bytes each tag's window would hold there, the tags deferred by barrier=False, and
        # whether reserve() sealed the pool. No memory is behind any of it.
        self._windows: dict[str, int] = {}
        self._deferred: set[str] = set()
        self._sealed = False

    def all_to_all_single_4d(
        self,
        x: torch.Tensor,
        mode: int,
        tag: str | None = None,
        *,
        seq_splits=None,
        head_splits=None,
        layout: str = "bshd",
        out: torch.Tensor | None = None,
        use_tma: bool | None = None,
        wire_dtype: torch.dtype | None = None,
        dequantize: bool = True,
    ) -> torch.Tensor:
        """One Ulysses all-to-all; collective: every rank makes the same call.

        Arguments:
            x: this rank's input, 4-d, in `layout` order: mode 0 (b, seq_splits[r], N, d),
                mode 1 (b, S, head_splits[r], d) (bshd); any strides (a strided view, e.g. a
                packed projection's q, is read as it is).
            mode: 0 / Mode.SEQ_TO_HEAD (sequence -> heads) or 1 / Mode.HEAD_TO_SEQ.
            tag: the call's window name, a non-empty str (there is no window here); None picks
                `fast_ulysses.tags.auto_tag(x, mode, layout)`.
            seq_splits, head_splits: per-rank rows / heads; None means even. Read once (a
                generator is fine): the backward uses the same values.
            layout: "bshd", "sbhd" or "bhsd".
            out: None, or a contiguous tensor of the call's output shape, with x's dtype and
                device, that shares no memory with x: the result is written there (bit for
                bit the tensor the call returns without it). Not differentiable: with grad mode
                on, neither x nor out may require grad. Every rank may choose separately
                whether to pass it.
            use_tma: accepted for code written against the upstream, as on UlyssesGroup.
            wire_dtype, dequantize: FP8 on the wire, as on UlyssesGroup (`fast_ulysses.wire`).

        Returns:
            `out` when given; else a new contiguous plain tensor of the plan's output shape that
            the caller owns. Either is ready in the current stream's order (it has waited for
            the collective: on NCCL a stream wait, not a host block), as with
            `dist.all_to_all_single`. The new tensor is differentiable: its backward is mode
            1 - m on `fast_ulysses.tags.backward_tag(tag)`.

        Raises:
            FastUlyssesError (a ValueError and a RuntimeError), before anything is sent: the
            plan's message for a bad shape, split, mode or layout, the fast path's for a bad
            tensor, the tag rule's, or one naming what is wrong with `out`, where every rank
            refuses its own call; at P > 1, on every rank and with one message naming the
            calls, where only some ranks refuse theirs or the ranks' calls differ (the call
            check, `fast_ulysses.call_check`: the device type is part of the call); after
            `destroy()`.
        """
        if wire_dtype is not None or dequantize is not True:
            return wire.exchange(
                self, x, mode, tag, wire_dtype=wire_dtype, dequantize=dequantize, out=out,
                seq_splits=seq_splits, head_splits=head_splits, layout=layout, use_tma=use_tma,
            )  # fmt: skip
        try:
            if use_tma is not None:
                check_use_tma(use_tma)
            seq_splits, head_splits = _read_once(seq_splits), _read_once(head_splits)
            tag, p = self._checked(OWNED, x, mode, tag, seq_splits, head_splits, layout, None, out)
            if out is not None:
                return _exchange(x, p, self.process_group, out)
            if not (x.requires_grad and torch.is_grad_enabled()):
                return _exchange(x, p, self.process_group)
            return TorchAllToAll.apply(
                x,
                self,
                lambda: _exchange(x, p, self.process_group),
                p.mode,
                tag,
                seq_splits,
                head_splits,
                layout,
            )
        except ValueError as error:
            raise refused(error) from None

    def all_to_all_single_4d_borrowed(
        self,
        x: torch.Tensor,
        mode: int,
        tag: str,
        *,
        seq_splits=None,
        head_splits=None,
        layout: str = "bshd",
        barrier: bool = True,
        wire_dtype: torch.dtype | None = None,
        dequantize: bool = True,
    ) -> torch.Tensor:
        """The borrowed variant; here the result is owned (no window, so no lifetime rule) and
        ready when the call returns, whatever `barrier` says. The rules are UlyssesGroup's all
        the same: the tag must be given, an input that requires grad is refused
        (`fast_ulysses.autograd.check_borrowed_grad`), and after barrier=False the tag refuses
        its next call until `barrier()`. `barrier` must be a bool
        (`fast_ulysses.validation.check_barrier`), the same on every rank (checked with the rest
        of the call). Arguments, returns and raises as `all_to_all_single_4d` (without `out`)."""
        if wire_dtype is not None or dequantize is not True:
            return wire.exchange(
                self, x, mode, tag, wire_dtype=wire_dtype, dequantize=dequantize, borrowed=True,
                seq_splits=seq_splits, head_splits=head_splits, layout=layout, barrier=barrier,
            )  # fmt: skip
        try:
            seq_splits, head_splits = _read_once(seq_splits), _read_once(head_splits)
            tag, p = self._checked(
                BORROWED, x, mode, tag, seq_splits, head_splits, layout, barrier, None
            )
            result = _exchange(x, p, self.process_group)
        except ValueError as error:
            raise refused(error) from None
        if not barrier:
            self._deferred.add(tag)
        return result

    @public
    def barrier(self) -> None:
        """Closes the borrowed calls made with barrier=False: their tags may be used again (the
        data is already here; nothing is sent).

        Raises:
            FastUlyssesError after `destroy()`.
        """
        self._check_alive()
        self._deferred.clear()
        self._barriers += 1  # (upstream.AsyncHandle: which deferred results it closed)
        self._deferred_open = False

    @public
    def reserve(self, calls) -> None:
        """Declares the calls this process will make and seals the group, as
        `UlyssesGroup.reserve` does: afterwards a call whose tag was not declared (or used
        before), or that needs more window than declared, is refused. No memory is allocated
        here (there are no windows) and nothing is sent; only the rule is the same.

        Arguments:
            calls: an iterable of `fast_ulysses.CallSpec`, or of dicts with its field names as
                keys: "tag", "shape", "mode", "dtype", and optionally "seq_splits",
                "head_splits", "layout".

        Raises:
            FastUlyssesError for `calls` that is not such an iterable; naming the first call
            (calls[index]) that is not a CallSpec or such a dict, has an unknown or missing
            key, or that the plan rejects; for a tag past the tag limit, or one deferred by
            barrier=False; after `destroy()`. A refused reserve() declares no tag and seals
            nothing.
        """
        self._check_alive()
        sizes = window_bytes_by_tag(calls, self.world_size, self.rank)
        tags = sorted(sizes)
        known = len(self._windows)
        for tag in tags:  # every tag rule before any tag is recorded: all or nothing
            new = tag not in self._windows
            if new or tag in self._deferred:
                _C.check_tag_use(tag, known, not new, tag in self._deferred)
            known += new
        for tag in tags:
            self._windows[tag] = max(self._windows.get(tag, -1), sizes[tag])
        self._sealed = True

    @public
    def stats(self) -> dict:
        """`UlyssesGroup.stats()`'s keys (one list, csrc/plan/group_stats.h), for code that
        reads either group. As on UlyssesGroup, `tags` is the number of distinct tags called or
        declared so far, `sealed` whether `reserve()` ran, and `deferred` the number of tags
        waiting for `barrier()`. Every other key is 0: there is no window pool (`pool_bytes`,
        `used_bytes`, `segments`), no call is issued from a cached graph (the graph counts) and
        there is no handshake (`wide_flags`)."""
        self._check_alive()
        own = {"sealed": self._sealed, "tags": len(self._windows), "deferred": len(self._deferred)}
        return {key: own.get(key, 0) for key in _C.GROUP_STATS_KEYS}

    def destroy(self) -> None:
        """Ends the group's use; later calls raise FastUlyssesError (a RuntimeError). Calling
        it again is a no-op. Lets go of the process group (`process_group` becomes None), so
        that dist.destroy_process_group() frees it while the interpreter is alive."""
        self._destroyed = True
        self.process_group = None
        self._call_check = None

    def __repr__(self) -> str:
        return group_repr(
            "TorchUlyssesGroup",
            self.rank,
            self.world_size,
            True,
            reason=self.fallback_reason,
            destroyed=self._destroyed,
        )

    # -- checks ----------------------------------------------------------------------------

    @torch.compiler.disable  # host-side: the checks and their collective stay out of traces
    def _checked(self, name, x, mode, tag, seq_splits, head_splits, layout, barrier, out):
        """Checks one call of entry `name` (with FAST_ULYSSES_DEBUG=1 through
        `check_agreement`; else at P > 1 through the call check, `_agree`), records its tag's
        window, and returns (tag, plan). `barrier` is None for the owned entry. Raises
        ValueError (the entry points make it a FastUlyssesError)."""
        self._check_alive()
        if self._call_check is not None:
            return self._commit(
                self._agree(name, x, mode, tag, seq_splits, head_splits, layout, barrier, out)
            )
        if not self._debug:
            return self._commit(
                self._prepare(name, x, mode, tag, seq_splits, head_splits, layout, barrier, out)
            )
        if name == OWNED and tag is None and isinstance(x, torch.Tensor):
            tag = resolve_tag(tag, x, mode, layout)
        prepared = []
        self._calls += 1
        # Every check of `_prepare` runs inside check_agreement's, so that a rank that refuses
        # its own call (its out=, a tag rule) still joins the gather and every rank raises.
        check_agreement(
            self.process_group,
            self.rank,
            self.world_size,
            self._calls,
            name,
            x,
            mode,
            tag,
            seq_splits,
            head_splits,
            layout,
            () if barrier is None else (barrier,),
            check_device=lambda _: prepared.append(
                self._prepare(name, x, mode, tag, seq_splits, head_splits, layout, barrier, out)
            ),
        )
        return self._commit(prepared[0])

    def _prepare(self, name, x, mode, tag, seq_splits, head_splits, layout, barrier, out):
        """This rank's checks of one call, with no effect on the group: the entry point's
        rules, the plan, the device rule, the tag rules and `out`. Returns (tag, plan, the tag's
        new window size or None); raises ValueError."""
        if name == BORROWED:
            check_borrowed_tag(tag)
            check_borrowed_grad(x)
            check_barrier(barrier)
        else:
            tag = resolve_tag(tag, x, mode, layout)
        check_tag(tag)
        p = plan_call(
            x,
            self.world_size,
            self.rank,
            mode,
            seq_splits=seq_splits,
            head_splits=head_splits,
            layout=layout,
        )
        _check_device(x, self._device_types)
        self._use_tag(tag)
        held = self._windows.get(tag, -1)
        window = None
        if p.window_bytes > held:
            window = _C.window_for_call(tag, p.window_bytes, held, self._sealed)
        if out is not None:
            _check_out(out, x, p)
        return tag, p, window

    def _commit(self, prepared) -> tuple[str, Plan]:
        tag, p, window = prepared
        if window is not None:
            self._windows[tag] = window
        return tag, p

    def _agree(self, name, x, mode, tag, seq_splits, head_splits, layout, barrier, out):
        """`_prepare` under the call check (`fast_ulysses.call_check.CallCheck.agree`): returns
        its result when every rank makes the same valid call; else raises on every rank."""
        self._calls += 1
        return self._call_check.agree(
            self._calls,
            lambda: self._prepare(
                name, x, mode, tag, seq_splits, head_splits, layout, barrier, out
            ),
            name,
            x,
            mode,
            tag,
            seq_splits,
            head_splits,
            layout,
            barrier,
            out,
        )

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


def _device_types(process_group) -> frozenset[str]:
    """The device types the process group's backends move tensors of (gloo: cpu and cuda;
    NCCL: cuda). Never meta: a meta tensor holds no data to send."""
    return frozenset(device.type for device in process_group._device_types) - {"meta"}


def _check_device(x: torch.Tensor, device_types: frozenset[str]) -> None:
    """The fallback's device rule: x on a device type its process group moves (the call
    check compares the device type across ranks). FastUlyssesError naming the device."""
    if x.device.type not in device_types:
        raise FastUlyssesError(
            f"x is on {x.device}: this group's process group moves tensors on "
            f"{' or '.join(sorted(device_types))} only (a meta tensor holds no data to send)"
        )


def _read_once(splits):
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


def _check_out(out, x: torch.Tensor, p: Plan) -> None:
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


def _axes(p: Plan) -> tuple[int, list[int], list[int], list[int]]:
    """(split dim, sender's splits, receiver's splits, chunk order) of a call."""
    dims = {axis: k for k, axis in enumerate(p.layout)}  # a layout's name is its axis order
    if p.mode == 0:
        split, cat, send, recv = dims["h"], dims["s"], p.head_splits, p.seq_splits
    else:
        split, cat, send, recv = dims["s"], dims["h"], p.seq_splits, p.head_splits
    order = [cat] + [k for k in range(4) if k != cat]
    return split, send, recv, order


def _exchange(x: torch.Tensor, p: Plan, group, out: torch.Tensor | None = None) -> torch.Tensor:
    """Moves one checked call's data: returns the output, written into `out` when given."""
    split, send_splits, recv_splits, order = _axes(p)
    es = x.element_size()
    xs = x.permute(order)
    pos = order.index(split)
    send = torch.empty(x.numel(), dtype=x.dtype, device=x.device)
    in_bytes, offset = [], 0
    for start, count in _ranges(send_splits):
        chunk = xs.narrow(pos, start, count)
        send[offset : offset + chunk.numel()].view(chunk.shape).copy_(chunk)
        offset += chunk.numel()
        in_bytes.append(chunk.numel() * es)
    out_c = [p.output_shape[k] for k in order]  # the output, cat dimension first
    row = math.prod(out_c[1:]) * es  # bytes of one cat-dimension slice
    out_bytes = [count * row for count in recv_splits]
    if out is not None and all(p.output_shape[k] == 1 for k in range(order[0])):
        # The output in "cat first" order is out itself (only size-1 dimensions precede cat):
        # receive straight into it.
        dist.all_to_all_single(
            out.view(-1).view(torch.uint8), send.view(torch.uint8), out_bytes, in_bytes, group=group
        )
        return out
    recv = funcol.all_to_all_single(send.view(torch.uint8), out_bytes, in_bytes, group)
    if isinstance(recv, funcol.AsyncCollectiveTensor):
        # Wait now (a stream wait on NCCL): an AsyncCollectiveTensor that is never used would
        # leave its work unwaited, and torch warns about that at exit.
        recv = recv.wait()
    result = recv.view(x.dtype).view(out_c).permute(_inverse(order))
    if out is not None:
        return out.copy_(result)
    return result if result.is_contiguous() else result.contiguous()


def _ranges(splits):
    start = 0
    for count in splits:
        yield start, count
        start += count


def _inverse(order: list[int]) -> list[int]:
    inverse = [0] * len(order)
    for position, dim in enumerate(order):
        inverse[dim] = position
    return inverse
