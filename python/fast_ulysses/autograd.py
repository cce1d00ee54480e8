"""Autograd for both groups, and the rule that keeps borrowed results out of it.

The all-to-all is a permutation of elements, so its gradient is the inverse permutation: the
backward of a call in mode m is a call in mode 1 - m with the same splits and layout, on the
tag `backward_tag(tag)` (its own window, so the backward never touches a forward window that
may still be in use). Gradients are therefore bit-exact.

- The fast group: `torch.library.register_autograd` on the C++-defined op
  `fast_ulysses::all_to_all_single_4d` (registered when `fast_ulysses` is imported), so eager
  autograd and torch.compile see the same backward. That kernel is Python, so UlyssesGroup's
  eager calls that need no grad take the typed entry, below autograd, and skip it (the host
  time this saves: docs/DESIGN.md, "One route per call"). The
  setup and the backward read the call by the op's argument names (`_C.OWNED_ARGUMENTS`, from
  csrc/ops/call_args.h). `..._borrowed` has a C++ Autograd kernel that applies the borrowed
  rule and records no backward. With FAST_ULYSSES_DEBUG=1 the backward
  checks its call's agreement across ranks through the group (`debug.debugged`).
- TorchUlyssesGroup: a `torch.autograd.Function` around its exchange (`TorchAllToAll`).

Borrowed results and autograd: a borrowed result is the receive window, overwritten by the next
call on its tag, while autograd may save it for the backward of whatever consumes it. So a
borrowed call whose input requires grad (with grad mode on) raises `ValueError`
(`check_borrowed_grad`), on both groups and on the raw op; the owned call is the one to use
when gradients are needed.

The tags it uses (`backward_tag`; `auto_tag` for `tag=None`) are in `fast_ulysses.tags`.
"""

from __future__ import annotations

import torch

from ._ops import _C
from .debug import debugged
from .tags import backward_tag


def check_borrowed_grad(x, entry: str = "all_to_all_single_4d_borrowed") -> None:
    """The borrowed entry points refuse an input that requires grad (with grad mode on): the
    C++ rule (`_C.check_borrowed_grad`, which the borrowed op's own Autograd kernel applies too).

    Raises:
        ValueError naming `entry`, the rule and the owned call to use instead.
    """
    if isinstance(x, torch.Tensor) and x.requires_grad and torch.is_grad_enabled():
        _refuse_borrowed_grad(x, entry)


@torch.compiler.disable  # run eagerly: under torch.compile too the caller gets the ValueError
def _refuse_borrowed_grad(x, entry: str) -> None:
    _C.check_borrowed_grad(x, entry)


# -- the fast group: autograd on the C++-defined ops -----------------------------------------

_OWNED = "fast_ulysses::all_to_all_single_4d"
# The op's argument names, in schema order (csrc/ops/call_args.h, the one definition).
_OWNED_ARGUMENTS = _C.OWNED_ARGUMENTS
_registered = False


def _setup_owned(ctx, inputs, output):
    # (torch.library hands every argument, defaults filled in, in schema order.)
    call = dict(zip(_OWNED_ARGUMENTS, inputs))
    del call["x"]
    call["mode"] = int(call["mode"])
    ctx.call = call


def _backward_owned(ctx, grad):
    call = ctx.call
    grad = grad.contiguous()  # autograd may hand an expanded gradient (that of a sum)
    backward = dict(call, x=grad, mode=1 - call["mode"], tag=backward_tag(call["tag"]))
    group = debugged(call["group_name"])
    # FAST_ULYSSES_DEBUG=1: the backward call is checked like any other, in eager autograd (a
    # plain tensor); a compiled backward is traced once, with no collective in the trace.
    if group is not None and type(grad) is torch.Tensor:
        group._before_call(
            "all_to_all_single_4d (backward)",
            grad,
            backward["mode"],
            backward["tag"],
            call["seq_splits"],
            call["head_splits"],
            call["layout"],
        )
    grad_x = torch.ops.fast_ulysses.all_to_all_single_4d(**backward)
    return (grad_x,) + (None,) * (len(_OWNED_ARGUMENTS) - 1)


def register_op_autograd() -> None:
    """Registers the owned op's backward (once; `fast_ulysses` calls it). The borrowed op's
    Autograd kernel is C++ (it records no backward)."""
    global _registered
    if _registered:
        return
    torch.library.register_autograd(_OWNED, _backward_owned, setup_context=_setup_owned)
    _registered = True


# -- the torch fallback ----------------------------------------------------------------------


class TorchAllToAll(torch.autograd.Function):
    """TorchUlyssesGroup's all-to-all with its backward (mode 1 - m, tag `backward_tag(tag)`,
    through the group's own entry point, so a double backward works too)."""

    @staticmethod
    def forward(ctx, x, group, exchange, mode, tag, seq_splits, head_splits, layout):
        ctx.group = group
        ctx.call = (mode, tag, seq_splits, head_splits, layout)
        return exchange()

    @staticmethod
    def backward(ctx, grad):
        mode, tag, seq_splits, head_splits, layout = ctx.call
        grad_x = ctx.group.all_to_all_single_4d(
            grad.contiguous(),
            1 - mode,
            backward_tag(tag),
            seq_splits=seq_splits,
            head_splits=head_splits,
            layout=layout,
        )
        return grad_x, None, None, None, None, None, None, None
