"""Tags, beside the groups that take them: the name `tag=None` stands for (`auto_tag`), the tag
of a call's backward (`backward_tag`), and the tag rules of one call (`resolve_tag`,
`check_borrowed_tag`). Both groups and autograd import them from here; the rule that a tag is a
non-empty str is `arguments.check_tag`, and the per-tag rules of the windows are C++
(csrc/plan/tag_rules.h).
"""

from __future__ import annotations

import torch

from .arguments import as_mode
from .errors import FastUlyssesError
from .validation import check_input

BACKWARD_SUFFIX = ":grad"
AUTO_PREFIX = "fu.auto"


def backward_tag(tag: str) -> str:
    """The tag of the backward of a call on `tag`: `tag + ":grad"` (a double backward appends
    it again)."""
    return f"{tag}{BACKWARD_SUFFIX}"


def auto_tag(x: torch.Tensor, mode, layout: str = "bshd") -> str:
    """The tag `tag=None` stands for: `"fu.auto:m<mode>:<layout>:<dtype>:<shape>"`, where
    `<shape>` is x's shape with the dimension that differs across ranks written as `*` (mode 0:
    the sequence dimension, which uneven `seq_splits` make rank-dependent; mode 1: the head
    dimension). Every rank of a call reaches the same name, e.g.
    `fu.auto:m0:bshd:bfloat16:1x*x12x128`.

    Calls of one shape share a window; that is safe for owned results (the window is copied
    out before the call returns) but not for borrowed ones, which therefore need an explicit tag.
    """
    mode = as_mode(mode)
    varying = "s" if mode == 0 else "h"
    position = layout.find(varying) if isinstance(layout, str) else -1
    dims = ["*" if i == position else str(int(n)) for i, n in enumerate(x.shape)]
    dtype = str(x.dtype).removeprefix("torch.")
    return f"{AUTO_PREFIX}:m{mode}:{layout}:{dtype}:{'x'.join(dims)}"


def resolve_tag(tag, x, mode, layout) -> str:
    """`tag` itself, or `auto_tag(x, mode, layout)` for None (the tag rule is checked later).

    Raises:
        ValueError (the input rule's) for tag=None with an x that is not a tensor.
    """
    if tag is not None:
        return tag
    if not isinstance(x, torch.Tensor):
        check_input(x)  # raises, naming x
    return auto_tag(x, mode, layout)


def check_borrowed_tag(tag) -> None:
    """Borrowed calls need an explicit tag (`auto_tag` shares a window between same-shaped
    calls, which would overwrite each other's borrowed results)."""
    if tag is None:
        raise FastUlyssesError(
            "tag is None: a borrowed call needs an explicit tag (its result "
            "lives until the next call on the tag); tag=None is for "
            "all_to_all_single_4d"
        )
