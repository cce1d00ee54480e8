"""Autograd for both groups, and the rule that keeps borrowed results out of it.

The all-to-all is a permutation of elements, so its gradient is the inverse permutation: the
backward of a call in mode m is a call in mode 1 - m with the same splits and layout, on the
tag `backward_tag(tag)` (its own window, so the backward never touches a forward window that
may still be in use). Gradients are therefore bit-exact.

- The fast group: the ops' Autograd kernels are C++ (csrc/ops/autograd_kernels.cpp): the owned
  op `fast_ulysses::all_to_all_single_4d` records this backward, so eager autograd, a direct
  `torch.ops` caller and torch.compile see the same one, and a call that records it runs no
  Python on its way to the transport; `..._borrowed` applies the borrowed rule and records no
  backward. With FAST_ULYSSES_DEBUG=1 the backward first has its call checked across ranks
  (`fast_ulysses.debug.check_backward`).
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
from .arguments import as_mode
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


# -- the torch fallback ----------------------------------------------------------------------


class TorchAllToAll(torch.autograd.Function):
    """TorchUlyssesGroup's all-to-all with its backward (mode 1 - m, tag `backward_tag(tag)`,
    through the group's own entry point, so a double backward works too)."""

    @staticmethod
    def forward(ctx, x, group, exchange, call):
        ctx.group, ctx.call = group, call  # (call: the forward's `fast_ulysses.call.Call`)
        return exchange()

    @staticmethod
    def backward(ctx, grad):
        call = ctx.call
        grad_x = ctx.group.all_to_all_single_4d(
            grad.contiguous(),
            1 - as_mode(call.mode),
            backward_tag(call.tag),
            seq_splits=call.seq_splits,
            head_splits=call.head_splits,
            layout=call.layout,
        )
        return grad_x, None, None, None
