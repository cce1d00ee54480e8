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
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ._ops import ops
from .api import as_mode, as_pool_bytes, check_tag, group_repr
from .autograd import TorchAllToAll, check_borrowed_grad, check_borrowed_tag, resolve_tag
from .debug import check_agreement, debug_enabled
from .plan import Plan
from .policy import agreement_message
from .validation import plan_call, window_bytes_by_tag
from .errors import FastUlyssesError


def _agreed_debug(process_group, world_size: int) -> bool:
    """This rank's FAST_ULYSSES_DEBUG, once every rank has shown it parses and agrees:
    collective at P > 1. With it set on some ranks only, their calls would wait in a check the
    others never join; a value refused on one rank would leave the others waiting here. Either
    way every rank raises the same ValueError (`policy.agreement_message`)."""
    try:
        debug, error = debug_enabled(), ""
    except ValueError as refused:
        debug, error = False, str(refused)
    everyone = [(debug, error)]
    if world_size > 1:
        everyone = [None] * world_size
        dist.all_gather_object(everyone, (debug, error), group=process_group)
    refused = agreement_message([d for d, _ in everyone], [e for _, e in everyone])
    if refused:
        raise FastUlyssesError(refused)
    return debug


class TorchUlyssesGroup:
    """The Ulysses all-to-alls on `torch.distributed`: permute, `all_to_all_single` with split
    sizes, permute back. Bit-exact with `UlyssesGroup` and `fast_ulysses.simulate`.

    Arguments:
        process_group: the ranks of the sequence-parallel group (None: the default group).
        initial_pool_bytes: accepted for signature parity with `UlyssesGroup`; unused (>= 0).
        decision: the `fast_ulysses.policy.Decision` make_group reached (it passes its own);
            its reason becomes `fallback_reason`. None: built directly ("requested").

    Attributes:
        fallback: always True.
        fallback_reason: why it was chosen ("requested" unless `make_group` says otherwise).
        rank, world_size: this rank in the group and the group's size.
        process_group: the group the collectives run on.

    Raises:
        ValueError for a group of more ranks than `fast_ulysses.plan.limits()["max_world_size"]`
        (8, one node: the plan's rule, for both groups), raised here rather than on each call.

    With FAST_ULYSSES_DEBUG=1 set when the group is built, every call is first checked against
    every rank's (`fast_ulysses.debug.check_agreement`), as on `UlyssesGroup`. Building the
    group is collective at P > 1: the ranks compare that setting, and where only some have it
    every rank raises ValueError (`fast_ulysses.policy.agreement_message`).
    """

    fallback = True
    rank: int
    world_size: int
    fallback_reason: str

    def __init__(self, process_group=None, initial_pool_bytes: int = 0, *, decision=None):
        if process_group is None:
            process_group = dist.group.WORLD
        if process_group is None:
            raise RuntimeError("TorchUlyssesGroup needs torch.distributed initialised: call "
                               "torch.distributed.init_process_group first")
        as_pool_bytes(initial_pool_bytes)
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        # The plan's limit holds for this group too: raise here, not on every call.
        ops.check_group(self.world_size, self.rank)
        self.initial_pool_bytes = initial_pool_bytes
        if decision is not None and decision.use_fast:
            raise FastUlyssesError(f"TorchUlyssesGroup was handed a decision for the fast group "
                             f"({decision.reason!r}): build UlyssesGroup, or call make_group")
        self.fallback_reason = "requested" if decision is None else decision.reason
        self._destroyed = False
        self._debug = _agreed_debug(process_group, self.world_size)
        self._calls = 0
        # The fast group's per-tag rules, applied here too (csrc/plan/tag_rules.h, through the
        # ops), so a program that breaks one fails on a CPU test as it would on the GPU: the
        # bytes each tag's window would hold there, the tags deferred by barrier=False, and
        # whether reserve() sealed the pool. No memory is behind any of it.
        self._windows: dict[str, int] = {}
        self._deferred: set[str] = set()
        self._sealed = False

    def all_to_all_single_4d(self, x: torch.Tensor, mode: int, tag: str | None = None, *,
                             seq_splits=None, head_splits=None,
                             layout: str = "bshd") -> torch.Tensor:
        """One Ulysses all-to-all; collective: every rank makes the same call.

        Arguments:
            x: this rank's input, 4-d contiguous, in `layout` order: mode 0
                (b, seq_splits[r], N, d), mode 1 (b, S, head_splits[r], d) (bshd).
            mode: 0 / Mode.SEQ_TO_HEAD (sequence -> heads) or 1 / Mode.HEAD_TO_SEQ.
            tag: the call's window name, a non-empty str (there is no window here); None picks
                `fast_ulysses.autograd.auto_tag(x, mode, layout)`.
            seq_splits, head_splits: per-rank rows / heads; None means even.
            layout: "bshd", "sbhd" or "bhsd".

        Returns:
            A new contiguous plain tensor of the plan's output shape that the caller owns,
            ready in the current stream's order (it has waited for the collective: on NCCL a
            stream wait, not a host block), as with `dist.all_to_all_single`. Differentiable:
            its backward is mode 1 - m on `fast_ulysses.autograd.backward_tag(tag)`.

        Raises:
            ValueError with the plan's message for a bad shape, split, mode or layout, the
            fast path's message for a bad tensor, or the tag rule's; with FAST_ULYSSES_DEBUG=1,
            on every rank when any rank's call is invalid or differs. RuntimeError after
            `destroy()`.
        """
        tag = resolve_tag(tag, x, mode, layout)
        return self._call("all_to_all_single_4d", x, mode, tag, seq_splits, head_splits, layout)

    def all_to_all_single_4d_borrowed(self, x: torch.Tensor, mode: int, tag: str, *,
                                      seq_splits=None, head_splits=None, layout: str = "bshd",
                                      barrier: bool = True) -> torch.Tensor:
        """The borrowed variant; here the result is owned (no window, so no lifetime rule) and
        ready when the call returns, whatever `barrier` says. The rules are UlyssesGroup's all
        the same: the tag must be given, an input that requires grad raises ValueError
        (`fast_ulysses.autograd.check_borrowed_grad`), and after barrier=False the tag refuses
        its next call until `barrier()` (FAST_ULYSSES_DEBUG=1 also checks that every rank
        passes the same `barrier`). Arguments, returns and raises as `all_to_all_single_4d`."""
        check_borrowed_tag(tag)
        check_borrowed_grad(x)
        out = self._call("all_to_all_single_4d_borrowed", x, mode, tag, seq_splits, head_splits,
                         layout, bool(barrier))
        if not barrier:
            self._deferred.add(tag)
        return out

    def barrier(self) -> None:
        """Closes the borrowed calls made with barrier=False: their tags may be used again (the
        data is already here; nothing is sent)."""
        self._check_alive()
        self._deferred.clear()

    def reserve(self, calls) -> None:
        """Declares the calls this process will make and seals the group, as
        `UlyssesGroup.reserve` does: afterwards a call whose tag was not declared (or used
        before), or that needs more window than declared, raises ValueError. No memory is
        allocated here (there are no windows); only the rule is the same.

        Arguments:
            calls: an iterable of `fast_ulysses.CallSpec`.

        Raises:
            ValueError naming the first call the plan rejects, or a tag past the tag limit.
        """
        self._check_alive()
        sizes = window_bytes_by_tag(calls, self.world_size, self.rank)
        for tag in sorted(sizes):
            self._use_tag(tag)
            self._windows[tag] = max(self._windows.get(tag, -1), sizes[tag])
        self._sealed = True

    def stats(self) -> dict:
        """`UlyssesGroup.stats()`'s keys (one list, csrc/plan/group_stats.h), for code that
        reads either group. As on UlyssesGroup, `tags` is the number of distinct tags called or
        declared so far, `sealed` whether `reserve()` ran, and `deferred` the number of tags
        waiting for `barrier()`. Every other key is 0: there is no window pool (`pool_bytes`,
        `used_bytes`, `segments`), no call is issued from a cached graph (the graph counts) and
        there is no handshake (`wide_flags`)."""
        self._check_alive()
        own = {"sealed": self._sealed, "tags": len(self._windows),
               "deferred": len(self._deferred)}
        return {key: own.get(key, 0) for key in ops.group_stats_keys()}

    def destroy(self) -> None:
        """Ends the group's use; later calls raise RuntimeError. Calling it again is a no-op."""
        self._destroyed = True

    def __repr__(self) -> str:
        return group_repr("TorchUlyssesGroup", self.rank, self.world_size, True,
                          reason=self.fallback_reason, destroyed=self._destroyed)

    def _call(self, name, x, mode, tag, seq_splits, head_splits, layout, *extra):
        self._check_alive()
        if self._debug:  # every rank learns of every rank's problem: all raise, none waits
            self._calls += 1
            check_agreement(self.process_group, self.rank, self.world_size, self._calls, name,
                            x, mode, tag, seq_splits, head_splits, layout, extra)
        check_tag(tag)
        p = plan_call(x, self.world_size, self.rank, mode, seq_splits=seq_splits,
                      head_splits=head_splits, layout=layout)
        self._use_tag(tag)
        held = self._windows.get(tag, -1)
        if p.window_bytes > held:
            self._windows[tag] = ops.window_for_call(tag, p.window_bytes, held, self._sealed)
        if not (x.requires_grad and torch.is_grad_enabled()):
            return _exchange(x, p, self.process_group)
        return TorchAllToAll.apply(x, self, lambda: _exchange(x, p, self.process_group),
                                   as_mode(mode), tag, seq_splits, head_splits, layout)

    def _use_tag(self, tag: str) -> None:
        """The fast group's tag rules: at most `limits()["max_tags"]` distinct tags, and none
        deferred by barrier=False before `barrier()` (ValueError, the transport's message)."""
        known = tag in self._windows
        if not known or tag in self._deferred:
            ops.check_tag_use(tag, len(self._windows), known, tag in self._deferred)

    def _check_alive(self) -> None:
        if self._destroyed:
            raise RuntimeError("this TorchUlyssesGroup was destroyed: build a new group with "
                               "fast_ulysses.make_group")


def _axes(p: Plan) -> tuple[int, list[int], list[int], list[int]]:
    """(split dim, sender's splits, receiver's splits, chunk order) of a call."""
    dims = {axis: k for k, axis in enumerate(p.layout)}  # a layout's name is its axis order
    if p.mode == 0:
        split, cat, send, recv = dims["h"], dims["s"], p.head_splits, p.seq_splits
    else:
        split, cat, send, recv = dims["s"], dims["h"], p.seq_splits, p.head_splits
    order = [cat] + [k for k in range(4) if k != cat]
    return split, send, recv, order


def _exchange(x: torch.Tensor, p: Plan, group) -> torch.Tensor:
    split, send_splits, recv_splits, order = _axes(p)
    es = x.element_size()
    xs = x.permute(order)
    pos = order.index(split)
    send = torch.empty(x.numel(), dtype=x.dtype, device=x.device)
    in_bytes, offset = [], 0
    for start, count in _ranges(send_splits):
        chunk = xs.narrow(pos, start, count)
        send[offset:offset + chunk.numel()].view(chunk.shape).copy_(chunk)
        offset += chunk.numel()
        in_bytes.append(chunk.numel() * es)
    out_c = [p.output_shape[k] for k in order]  # the output, cat dimension first
    row = math.prod(out_c[1:]) * es  # bytes of one cat-dimension slice
    out_bytes = [count * row for count in recv_splits]
    recv = funcol.all_to_all_single(send.view(torch.uint8), out_bytes, in_bytes, group)
    if isinstance(recv, funcol.AsyncCollectiveTensor):
        # Wait now (a stream wait on NCCL): an AsyncCollectiveTensor that is never used would
        # leave its work unwaited, and torch warns about that at exit.
        recv = recv.wait()
    out = recv.view(x.dtype).view(out_c).permute(_inverse(order))
    return out if out.is_contiguous() else out.contiguous()


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
