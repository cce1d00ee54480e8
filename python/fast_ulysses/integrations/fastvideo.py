"""FastVideo: `all_to_all_4D` (FastVideo uses its global sequence-parallel group; here that is
the `group` keyword, default the default process group)."""

from __future__ import annotations

import torch

from ._common import exchange


def all_to_all_4D(
    input_: torch.Tensor, scatter_dim: int = 2, gather_dim: int = 1, *, group=None
) -> torch.Tensor:
    """(bs, seq/P, hc, hs) -> (bs, seq, hc/P, hs) for scatter_dim=2, gather_dim=1; the inverse
    for scatter_dim=1, gather_dim=2. Differentiable. Other pairs raise ValueError."""
    return exchange(input_, scatter_dim, gather_dim, group, names=("scatter_dim", "gather_dim"))
