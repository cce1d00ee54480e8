"""What every adapter shares: mapping an upstream (scatter, gather) index pair to our mode."""

from __future__ import annotations

import torch

from ..attention import group_for
from ..errors import FastUlyssesError


def mode_for(
    scatter: int, gather: int, layout: str, names=("scatter_idx", "gather_idx"), ndim: int = 4
) -> int:
    """Mode 0 when the pair scatters heads and gathers the sequence of `layout`, mode 1 for the
    reverse pair.

    Raises:
        ValueError naming both indices and the pairs this layout supports.
    """
    seq, head = layout.index("s"), layout.index("h")
    pair = tuple(i + ndim if isinstance(i, int) and i < 0 else i for i in (scatter, gather))
    if pair == (head, seq):
        return 0
    if pair == (seq, head):
        return 1
    raise FastUlyssesError(
        f"{names[0]}={scatter}, {names[1]}={gather}: unsupported for a {layout} "
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
    splits (the upstream APIs divide evenly), an owned and differentiable result."""
    mode = mode_for(scatter, gather, layout, names)
    if not isinstance(x, torch.Tensor) or x.dim() != 4:
        raise FastUlyssesError(
            f"input has shape {tuple(getattr(x, 'shape', ()))}: it must be a 4-d tensor ({layout})"
        )
    return group_for(group).all_to_all_single_4d(x.contiguous(), mode, None, layout=layout)
