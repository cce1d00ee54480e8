"""diffusers' context parallelism (Ulysses): `_all_to_all_dim_exchange`."""

from __future__ import annotations

import torch

from ._common import exchange


def _all_to_all_dim_exchange(x: torch.Tensor, scatter_idx: int = 2, gather_idx: int = 1,
                             group=None) -> torch.Tensor:
    """(B, S_LOCAL, H, D) -> (B, S, H_LOCAL, D) for scatter_idx=2, gather_idx=1; the inverse
    for scatter_idx=1, gather_idx=2. `group`: the sequence-parallel ProcessGroup (None: the
    default group). Differentiable. Other index pairs raise ValueError."""
    return exchange(x, scatter_idx, gather_idx, group)
