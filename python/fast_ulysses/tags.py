"""Tags, beside the groups that take them: the name `tag=None` stands for (`auto_tag`), the tag
of a call's backward (`backward_tag`), and the tag rules of one call (`resolve_tag`,
`check_borrowed_tag`). Both groups and autograd import them from here; the rule that a tag is a
non-empty str is `arguments.check_tag`, and the per-tag rules of the windows are C++
(csrc/plan/tag_rules.h).
"""

from __future__ import annotations

import torch

from ._ops import _C
from .arguments import as_mode, check_tag
from .errors import FastUlyssesError, refused
from .plan import LAYOUTS, check_mode_and_layout
from .validation import check_input

BACKWARD_SUFFIX = _C.BACKWARD_SUFFIX  # ":grad" (csrc/plan/tag_rules.h, which the C++ backward uses)
AUTO_PREFIX = "fu.auto"


def backward_tag(tag: str) -> str:
    """The tag of the backward of a call on `tag`: `tag + ":grad"` (a double backward appends
    it again).

    Raises:
        FastUlyssesError for a tag that is not a non-empty str (`arguments.check_tag`).
    """
    if type(tag) is not str or not tag:  # (the hot path, a checked tag, costs one type check)
        check_tag(tag)
    return f"{tag}{BACKWARD_SUFFIX}"


def auto_tag(x: torch.Tensor, mode, layout: str = "bshd") -> str:
    """The tag `tag=None` stands for: `"fu.auto:m<mode>:<layout>:<dtype>:<shape>"`, where
    `<shape>` is x's shape with the dimension that differs across ranks written as `*` (mode 0:
    the sequence dimension, which uneven `seq_splits` make rank-dependent; mode 1: the head
    dimension). Every rank of a call reaches the same name, e.g.
    `fu.auto:m0:bshd:bfloat16:1x*x12x128`.

    Calls of one shape share a window; that is safe for owned results (the window is copied
    out before the call returns) but not for borrowed ones, which therefore need an explicit tag.

    Raises:
        FastUlyssesError naming x (not a 4-d torch.Tensor: the input rule's message), mode (not
        0 or 1) or layout (not one of `plan.LAYOUTS`): the plan's messages.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        try:
            check_input(x)  # raises, naming x
        except ValueError as error:
            raise refused(error) from None
    if type(mode) is not int or not 0 <= mode <= 1 or type(layout) is not str:
        mode, layout = check_mode_and_layout(mode, layout)
    elif layout not in LAYOUTS:
        check_mode_and_layout(mode, layout)  # raises, naming layout
    return _auto_tag(x, mode, layout)


def _auto_tag(x: torch.Tensor, mode, layout) -> str:
    """`auto_tag`'s name without its checks of x's dimensions, mode's value and layout, for
    `resolve_tag`: the call checks those itself, later (with FAST_ULYSSES_DEBUG=1 inside its
    agreement gather, where every rank raises; a rank refusing here could leave the others
    waiting in the gather)."""
    mode = as_mode(mode)
    varying = "s" if mode == 0 else "h"
    position = layout.find(varying) if isinstance(layout, str) else -1
    dims = ["*" if i == position else str(int(n)) for i, n in enumerate(x.shape)]
    dtype = str(x.dtype).removeprefix("torch.")
    return f"{AUTO_PREFIX}:m{mode}:{layout}:{dtype}:{'x'.join(dims)}"


def resolve_tag(tag, x, mode, layout) -> str:
    """`tag` itself, or `auto_tag`'s name for None (the tag rule is checked later).

    Raises:
        FastUlyssesError for tag=None with an x that is not a tensor or a mode that is not an
        int (the rest of `auto_tag`'s checks are the call's own, made later).
    """
    if tag is not None:
        return tag
    if not isinstance(x, torch.Tensor):
        check_input(x)  # raises, naming x
    return _auto_tag(x, mode, layout)


def check_borrowed_tag(tag) -> None:
    """Borrowed calls need an explicit tag (`auto_tag` shares a window between same-shaped
    calls, which would overwrite each other's borrowed results)."""
    if tag is None:
        raise FastUlyssesError(
            "tag is None: a borrowed call needs an explicit tag (its result "
            "lives until the next call on the tag); tag=None is for "
            "all_to_all_single_4d"
        )
