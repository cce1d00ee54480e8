"""`TorchUlyssesGroup`: the fast group's entry points on plain `torch.distributed`.

The fallback `make_group` picks where the fast path would lose (GPUs on different CPU sockets
over PCIe, no P2P, a group spanning nodes) and the reference for tests. It works on any backend
whose `all_to_all_single` takes split sizes: gloo on CPU tensors, NCCL on GPUs.

How one call moves data: `fast_ulysses.torch_exchange`; its checks: `fast_ulysses.torch_checks`.

Before any data moves, every call at P > 1 checks that the ranks agree on it: one small int64
all-gather of what each rank believes the call is (`fast_ulysses.call_check` says what is compared
and when a call is refused). FAST_ULYSSES_CHECK_CALLS=0 turns the check off; with
FAST_ULYSSES_DEBUG=1 the debug check (`fast_ulysses.debug.check_agreement`) runs instead.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from . import wire
from ._ops import _C
from .arguments import as_pool_bytes, group_repr
from .autograd import TorchAllToAll
from .call import BORROWED, OWNED, Call, new_call
from .call_check import CallCheck, agreed_settings
from .errors import FastUlyssesError, public, refused
from .topology import Decision
from .torch_checks import CallChecks, device_types, read_once
from .torch_exchange import exchange
from .upstream import UpstreamNames
from .upstream_options import (
    as_device,
    check_upstream_options,
    check_use_tma,
    is_device_argument,
)
from .validation import window_bytes_by_tag


class TorchUlyssesGroup(CallChecks, UpstreamNames):
    """The Ulysses all-to-alls on `torch.distributed`: permute, `all_to_all_single` with split
    sizes, permute back. Bit-exact with `UlyssesGroup` and `fast_ulysses.simulate`.

    Arguments:
        process_group: the ranks of the sequence-parallel group (None: the default group).
        initial_pool_bytes: accepted for signature parity with `UlyssesGroup`; unused (>= 0).
        device, require_nvlink, backend: UlyssesGroup's, checked by the same rules
            (`fast_ulysses.upstream_options.check_upstream_options`), so code written for it builds this
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
        self._device_types = device_types(process_group)
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
            seq_splits, head_splits = read_once(seq_splits), read_once(head_splits)
            call = new_call(Call, (OWNED, x, mode, tag, seq_splits, head_splits, layout, None, out))
            tag, p = self._checked(call)
            if out is not None:
                return exchange(x, p, self.process_group, out)
            if not (x.requires_grad and torch.is_grad_enabled()):
                return exchange(x, p, self.process_group)
            return TorchAllToAll.apply(
                x, self, lambda: exchange(x, p, self.process_group), call._replace(tag=tag)
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
            seq_splits, head_splits = read_once(seq_splits), read_once(head_splits)
            tag, p = self._checked(
                new_call(
                    Call, (BORROWED, x, mode, tag, seq_splits, head_splits, layout, barrier, None)
                )
            )
            result = exchange(x, p, self.process_group)
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
