"""UlyssesGroup: the fast path. A thin wrapper over the C++ transport (csrc/transport) reached
through the ops `torch.ops.fast_ulysses.*` (eager calls through `fast_ulysses._cuda`'s typed
dispatcher calls of the same ops: csrc/ops/fast_entry.cpp); everything that moves bytes or
signals is in C++."""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Iterable, Sequence

import torch
import torch.distributed as dist

from . import wire
from ._ops import _C, cuda_load_error, cuda_module, ops
from .arguments import as_mode, as_pool_bytes, as_splits, group_repr
from .autograd import check_borrowed_grad
from .call import BORROWED, OWNED, Call, new_call
from .debug import debug_enabled, register_debugged, unregister_debugged
from .errors import FastUlyssesError, public, refused
from .group_checks import FastCallChecks, check_decision, forget, forget_collected
from .tags import check_borrowed_tag, resolve_tag
from .topology import Decision
from .upstream import UpstreamNames
from .upstream_options import (
    as_device,
    check_upstream_options,
    check_use_tma,
    is_device_argument,
)
from .validation import check_barrier


class UlyssesGroup(FastCallChecks, UpstreamNames):
    """Ulysses all-to-alls over one node's GPUs, with copy-engine writes into peers' windows.

    Arguments:
        process_group: the c10d group of the sequence-parallel ranks (None: the default group).
            Any backend works for the setup (gloo, nccl); the transfer does not use it.
        initial_pool_bytes: bytes of symmetric memory to allocate for windows up front. The pool
            grows on demand (collectively) unless `reserve()` sealed it. A torch.device
            here is taken as `device` (the upstream's second argument).
        device: this rank's GPU (default: the current CUDA device).
        require_nvlink: refuse a group with two ranks on GPUs whose link is known not to be
            NVLink (`fast_ulysses.upstream_options.nvlink_refusal`); make_group passes False (its own
            rules decide).
        backend: "pitched", the one transport (`fast_ulysses.upstream_options.check_backend`).
        decision, topology: the `fast_ulysses.topology.Decision` make_group reached for this
            group and the `Topology` it judged (make_group passes both); when None, the group
            gathers the topology over the process group (collective) and decides with
            prefer="fast" itself: the same rules, the same error.

    Raises:
        RuntimeError: the CUDA part of the extension did not load, or no GPU.
        ValueError: `topology.cannot_run_message`: a pair of ranks whose GPUs cannot map each
            other's memory (named), ranks on different hosts, ranks sharing a GPU without
            FAST_ULYSSES_ALLOW_SHARED_GPU=1, ...; a FAST_ULYSSES_* setting refused on any rank
            (`topology.settings_message`, on every rank); GPUs not NVLink-joined with
            require_nvlink=True; or a `decision` for the fallback. Both are RuntimeErrors too.

    A group dropped without `destroy()` lets go of its windows when it is collected (not
    collectively: this rank's work on it is drained first), so another group can be built on the
    same process group; several may live on one process group at once.
    """

    fallback = False
    fallback_reason = ""
    backend = "pitched"
    ring_group = None  # the ring's ProcessGroup where make_group got a mesh or a pair
    rank: int
    world_size: int

    @public
    def __init__(
        self,
        process_group: dist.ProcessGroup | None = None,
        initial_pool_bytes: int = 0,
        *,
        device: torch.device | int | str | None = None,
        require_nvlink: bool = True,
        backend: str = "pitched",
        decision: Decision | None = None,
        topology=None,
    ):
        if is_device_argument(initial_pool_bytes) and device is None:
            initial_pool_bytes, device = 0, initial_pool_bytes
        initial_pool_bytes = as_pool_bytes(initial_pool_bytes)  # arguments before the machine
        check_upstream_options(device, require_nvlink, backend)
        if process_group is not None and not isinstance(process_group, dist.ProcessGroup):
            raise FastUlyssesError(
                f"process_group is {process_group!r}: it must be a torch.distributed "
                "ProcessGroup, or None for the default group"
            )
        blocker = self._local_blocker(device)
        if blocker:
            raise RuntimeError(blocker)
        self.process_group = process_group or dist.group.WORLD
        self.group_name = self.process_group.group_name
        self.rank = dist.get_rank(self.process_group)
        self.world_size = dist.get_world_size(self.process_group)
        _C.check_group(self.world_size, self.rank)  # the plan's limit, as on the fallback
        if device is None:
            device = torch.cuda.current_device()
        device = as_device(device)
        if device.type != "cuda":
            raise FastUlyssesError(f"device={device}: UlyssesGroup needs a CUDA device")
        self.device = torch.device(
            "cuda", device.index if device.index is not None else torch.cuda.current_device()
        )
        self._calls = 0
        self._destroyed = False
        # (Collective, and first: a setting refused on any rank raises on every rank here.)
        check_decision(self.process_group, self.device, decision, topology, require_nvlink)
        self._debug = debug_enabled()
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group

        with warnings.catch_warnings():  # needed on torch 2.10, a deprecated no-op on 2.11
            warnings.simplefilter("ignore", FutureWarning)
            enable_symm_mem_for_group(self.group_name)
        forget_collected()  # (outside any capture: construction allocates)
        self.group_name = ops.create_group(self.group_name, self.device.index, initial_pool_bytes)
        self._forget = weakref.finalize(self, forget, self.group_name)
        self._forget.atexit = False  # at exit the process's CUDA state goes anyway
        if self._debug:  # the backward (autograd.py) checks its calls through this group
            register_debugged(self)

    @staticmethod
    def _local_blocker(device=None) -> str:
        """Why this process cannot build the group whatever its peers say ("" when it can):
        the checks made before anything collective (`create()` votes on them)."""
        if cuda_load_error:
            return f"UlyssesGroup needs the CUDA part of fast-ulysses: {cuda_load_error}"
        if not torch.cuda.is_available():
            return "UlyssesGroup needs a CUDA GPU; none is visible (use TorchUlyssesGroup or make_group)"
        if not dist.is_initialized():
            return "UlyssesGroup needs torch.distributed: call dist.init_process_group first"
        if device is not None:
            device = as_device(device)
            if device.type != "cuda" or (device.index or 0) >= torch.cuda.device_count():
                return f"device={device}: not one of this process's {torch.cuda.device_count()} CUDA devices"
        return ""

    # -- the collectives -------------------------------------------------------------------

    def all_to_all_single_4d(
        self,
        x: torch.Tensor,
        mode: int,
        tag: str | None = None,
        *,
        seq_splits: Sequence[int] | None = None,
        head_splits: Sequence[int] | None = None,
        layout: str = "bshd",
        out: torch.Tensor | None = None,
        use_tma: bool | None = None,
        wire_dtype: torch.dtype | None = None,
        dequantize: bool = True,
    ) -> torch.Tensor:
        """One all-to-all. Mode 0: (b, seq_splits[r], N, d) -> (b, S, head_splits[r], d);
        mode 1 the inverse; sbhd swaps the first two dimensions, bhsd is (b, heads, seq, d).

        Arguments:
            out: a contiguous tensor of the output's shape and x's dtype on the group's device,
                sharing no bytes with x or the tag's window, to fill instead of a new tensor
                (not with an input that requires grad: out= records no backward).
            use_tma: accepted for code written against the upstream (None or a bool); every
                call takes the same path (`fast_ulysses.upstream_options.check_use_tma`).
            wire_dtype, dequantize: FP8 on the wire (`fast_ulysses.wire`; docs/API.md, "FP8 on
                the wire"): with `out`, out is x's dtype, filled with the dequantized result.

        Returns:
            A new tensor the caller owns. In eager mode with peers it is an
            `AsyncCollectiveTensor` (torch.distributed._functional_collectives): the transfer
            is still in flight, and the first aten op on the result makes the stream it runs
            on wait for it, on the device (the host never waits). Work queued before that runs
            beside the transfer. At P = 1, under torch.compile and under CUDA-graph capture it
            is a plain tensor ready in the current stream's order. With `out`: `out` itself,
            ready in the current stream's order (a caller that goes on reading its own buffer
            never sees it half-written). Differentiable: its backward
            is mode 1 - m on `fast_ulysses.tags.backward_tag(tag)`. tag=None picks
            `fast_ulysses.tags.auto_tag(x, mode, layout)`.

        Raises:
            FastUlyssesError (a ValueError and a RuntimeError) naming the argument and the
            rule, before anything is sent.
        """
        if wire_dtype is not None or dequantize is not True:
            return wire.exchange(
                self, x, mode, tag, wire_dtype=wire_dtype, dequantize=dequantize, out=out,
                seq_splits=seq_splits, head_splits=head_splits, layout=layout, use_tma=use_tma,
            )  # fmt: skip
        try:
            if use_tma is not None:
                check_use_tma(use_tma)
            if tag is None:
                tag = resolve_tag(tag, x, mode, layout)
            call = new_call(Call, (OWNED, x, mode, tag, seq_splits, head_splits, layout, None, out))
            self._before_call(call)
            args = self._op_args(call)
            if out is not None:
                return self._into(args, out)
            if torch.compiler.is_compiling():
                return ops.all_to_all_single_4d(*args)
            # An eager call: the typed entry (an AsyncCollectiveTensor where the transfer is in
            # flight; through the op's C++ Autograd kernel where it records a backward). What
            # it declines goes through torch.ops (a plain tensor, ready in the current stream's
            # order). The routes: docs/DESIGN.md, "One route per call".
            result = cuda_module.owned(*args)
            return ops.all_to_all_single_4d(*args) if result is NotImplemented else result
        except ValueError as error:
            raise refused(error) from None

    def _op_args(self, call) -> tuple:
        """The op's arguments for `call`, in schema order (csrc/ops/call_args.h): the borrowed
        op's barrier before the rank. Mode and splits as the ops take them (`as_mode`,
        `as_splits`: the common case, a plain 0 or 1 and None, costs a type check each)."""
        x, mode, tag, seq, head, layout, barrier = call[1:8]
        if type(mode) is not int or not 0 <= mode <= 1:
            mode = as_mode(mode)
        if seq is not None:
            seq = as_splits(seq, "seq_splits")
        if head is not None:
            head = as_splits(head, "head_splits")
        if barrier is None:
            return (x, mode, tag, self.group_name, seq, head, layout, self.rank)
        return (x, mode, tag, self.group_name, seq, head, layout, bool(barrier), self.rank)

    def _into(self, args, out) -> torch.Tensor:
        """The owned call into the caller's `out` (the op checks it before anything is sent)."""
        x = args[0]
        if not isinstance(out, torch.Tensor):
            raise FastUlyssesError(
                f"out is a {type(out).__name__}: it must be a torch.Tensor (or None)"
            )
        if x.requires_grad and torch.is_grad_enabled():
            raise FastUlyssesError(
                "out= with an input that requires grad: out= records no "
                "backward; call without out= when gradients are needed"
            )
        if torch.compiler.is_compiling():  # traced as the owned op and a copy
            return out.copy_(ops.all_to_all_single_4d(*args))
        result = cuda_module.owned_out(*args, out)
        return ops.all_to_all_single_4d_out(*args, out=out) if result is NotImplemented else result

    def all_to_all_single_4d_borrowed(
        self,
        x: torch.Tensor,
        mode: int,
        tag: str,
        *,
        seq_splits: Sequence[int] | None = None,
        head_splits: Sequence[int] | None = None,
        layout: str = "bshd",
        barrier: bool = True,
        wire_dtype: torch.dtype | None = None,
        dequantize: bool = True,
    ) -> torch.Tensor:
        """Like all_to_all_single_4d, but returns this rank's receive window for `tag` itself:
        one copy less, valid until the next call with the same tag (other tags leave it alone).
        With barrier=True (and peers, in eager mode) it is an `AsyncCollectiveTensor` whose
        first use waits for the transfer on the device, as for the owned call.

        With barrier=False the closing handshake is deferred: the result (a plain tensor) may be
        read only after `barrier()`, and `x` may not be modified before then. Several calls (a
        layer's q, k, v) then share one barrier.

        Under torch.compile this traces as `all_to_all_single_4d` (an owned result, closed by
        its own handshake): CUDA-graph trees (mode="reduce-overhead") refuse a graph output that
        lives outside their memory pool, as a window does. Results are the same.

        Raises:
            FastUlyssesError: no tag given; a barrier that is not a bool
            (`fast_ulysses.validation.check_barrier`); an input that requires grad
            (`fast_ulysses.autograd.check_borrowed_grad`: use the owned call for gradients); an
            input whose bytes overlap this tag's window (a borrowed result of the same tag fed
            back: clone() it or use another tag); and every rule of the owned call.

        With wire_dtype, the packed result is the window: dequantize makes a new tensor,
        dequantize=False returns views of the window (`fast_ulysses.wire`).
        """
        if wire_dtype is not None or dequantize is not True:
            return wire.exchange(
                self, x, mode, tag, wire_dtype=wire_dtype, dequantize=dequantize, borrowed=True,
                seq_splits=seq_splits, head_splits=head_splits, layout=layout, barrier=barrier,
            )  # fmt: skip
        try:
            check_borrowed_tag(tag)
            check_barrier(barrier)
            check_borrowed_grad(x)
            if torch.compiler.is_compiling():
                return self.all_to_all_single_4d(
                    x, mode, tag, seq_splits=seq_splits, head_splits=head_splits, layout=layout
                )
            call = new_call(
                Call, (BORROWED, x, mode, tag, seq_splits, head_splits, layout, barrier, None)
            )
            self._before_call(call)
            args = self._op_args(call)
            # The typed entry (below autograd: the op's Autograd kernel only applies the rule
            # checked above), or torch.ops (through that kernel) where it declines.
            result = cuda_module.borrowed(*args)
            return ops.all_to_all_single_4d_borrowed(*args) if result is NotImplemented else result
        except ValueError as error:
            raise refused(error) from None

    @public
    def barrier(self) -> None:
        """Closes every deferred borrowed call (barrier=False): stream-ordered on the caller's
        stream, after it every peer's data has landed in this rank's windows."""
        self._check_live()
        ops.barrier(self.group_name)
        self._barriers += 1  # (upstream.AsyncHandle: which deferred results it closed)
        self._deferred_open = False

    # -- windows ---------------------------------------------------------------------------

    @public
    def reserve(self, calls: Iterable) -> None:
        """Pre-sizes the window of every tag the process will use and seals the pool.

        Arguments:
            calls: `fast_ulysses.CallSpec`s, or dicts with the keys tag, shape, mode and
                dtype (and optionally seq_splits, head_splits, layout), one per distinct call
                this rank will make (shape is this rank's input shape). Collective: every rank
                passes the same calls.

        After this, a call whose tag was not declared, or that needs a larger window than
        declared, raises ValueError before anything is sent.
        """
        self._check_live()
        from .validation import window_bytes_by_tag

        sizes = window_bytes_by_tag(calls, self.world_size, self.rank)
        tags = sorted(sizes)
        ops.reserve(self.group_name, tags, [sizes[t] for t in tags])

    @public
    def stats(self) -> dict:
        """Pool capacity and use, segments, sealed, tags, deferred tags, the counts of eager
        calls launched from cached CUDA graphs, and whether the handshake waits for two peers'
        flags per operation (for tests, doctor, benchmarks; docs/API.md)."""
        self._check_live()
        names, values = ops.group_stats(self.group_name)  # named in C++
        return {n: bool(v) if n == "sealed" else v for n, v in zip(names, values)}

    def _host_profile(self) -> dict:
        """With FAST_ULYSSES_HOST_PROFILE=1 set before the group was made: host microseconds per
        call in each stage of the calls since the last read (and their count); resets them.
        For benchmarks (fast_ulysses.bench.quick_wan)."""
        self._check_live()
        stages, ns, calls = ops.host_profile(self.group_name)
        per_call = {s: (n / 1e3 / calls if calls else 0.0) for s, n in zip(stages, ns)}
        return {"calls": calls, "us_per_call": per_call}

    @public
    def destroy(self) -> None:
        """Waits for this rank's work and for every rank (collective), then frees the windows.
        Any later call on this group raises; calling destroy() again is a no-op (as on
        TorchUlyssesGroup)."""
        if self._destroyed:
            return
        self._forget.detach()
        ops.destroy_group(self.group_name)
        self._destroyed = True
        unregister_debugged(self)
        self.process_group = None  # (see TorchUlyssesGroup.destroy)

    def __repr__(self) -> str:
        return group_repr(
            "UlyssesGroup",
            self.rank,
            self.world_size,
            False,
            device=self.device,
            destroyed=self._destroyed,
        )
