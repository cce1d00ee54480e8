"""What every adapter shares: the int and tensor rules of their arguments, and mapping an
upstream (scatter, gather) index pair to our mode."""

from __future__ import annotations

import operator
import reprlib

import torch
import torch.distributed as dist

from ..attention import group_for
from ..errors import FastUlyssesError


def is_int(value) -> bool:
    """The adapters' int rule (as the groups' ops take ints): an int or anything with
    __index__, never a bool (True would pass as 1), a bool tensor or a float."""
    if type(value) is int:
        return True
    if isinstance(value, bool) or getattr(value, "dtype", None) == torch.bool:
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def as_index(value, name: str) -> int:
    """`value`, a dimension index, as an int.

    Raises:
        FastUlyssesError("<name>=<value!r>: it must be an int ...") unless `is_int(value)`.
    """
    if not is_int(value):
        raise FastUlyssesError(
            f"{name}={reprlib.repr(value)}: it must be an int (a dimension index; not a bool, "
            "float or str)"
        )
    return operator.index(value)


def check_tensor(name: str, t, ndim: int, rule: str) -> None:
    """Raises FastUlyssesError("<name> is <value>: <rule>") unless t is a torch.Tensor of `ndim`
    dimensions (a tensor is named by its shape). `rule` starts "it must be ..." or states it."""
    if not isinstance(t, torch.Tensor):
        raise FastUlyssesError(f"{name} is {reprlib.repr(t)}: {rule}")
    if t.dim() != ndim:
        raise FastUlyssesError(f"{name} has shape {tuple(t.shape)}: {rule}")


def world_of(group) -> tuple[int, int]:
    """(world size, rank) of an upstream `group` (a ProcessGroup, None: the default group, or a
    fast-ulysses group) without building its fast-ulysses group, which is a collective: so that
    an adapter checks its arguments before any rank waits on another.

    Raises:
        FastUlyssesError (from `group_for`) for a group of another kind; RuntimeError for None
        while torch.distributed is not initialised.
    """
    if isinstance(group, dist.ProcessGroup):
        return dist.get_world_size(group), dist.get_rank(group)
    if group is None and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    found = group_for(group)  # a fast-ulysses group as is; anything else raises
    return found.world_size, found.rank


def mode_for(
    scatter, gather, layout: str, names=("scatter_idx", "gather_idx"), ndim: int = 4
) -> int:
    """Mode 0 when the pair scatters heads and gathers the sequence of `layout`, mode 1 for the
    reverse pair.

    Raises:
        FastUlyssesError naming an index that is not an int (`as_index`), or both indices and
        the pairs this layout supports.
    """
    scatter, gather = as_index(scatter, names[0]), as_index(gather, names[1])
    seq, head = layout.index("s"), layout.index("h")
    pair = tuple(i + ndim if i < 0 else i for i in (scatter, gather))
    if pair == (head, seq):
        return 0
    if pair == (seq, head):
        return 1
    raise FastUlyssesError(
        f"{names[0]}={scatter!r}, {names[1]}={gather!r}: unsupported for a {layout} "
        f"input; supported: ({head}, {seq}) (scatter heads, gather the sequence) "
        f"and ({seq}, {head}) (the reverse)"
    )


def exchange(
    x: torch.Tensor,
    scatter: int,
    gather: int,
    group,
    layout: str = "bshd",
    names=("scatter_idx", "gather_idx"),
) -> torch.Tensor:
    """The all-to-all an upstream (scatter, gather) pair means, on `group_for(group)`; even
    splits (the upstream APIs divide evenly), an owned and differentiable result. Every
    argument is checked before the group is resolved or anything is sent."""
    mode = mode_for(scatter, gather, layout, names)
    check_tensor("input", x, 4, f"it must be a 4-d tensor ({layout})")
    return group_for(group).all_to_all_single_4d(x.contiguous(), mode, None, layout=layout)
