"""DeepSpeed-Ulysses: `DistributedAttention`."""

from __future__ import annotations

import torch

from ..attention import group_for

# batch_dim_idx -> layout: 0 = (b, s, h, d), 1 = (s, b, h, d).
_LAYOUTS = {0: "bshd", 1: "sbhd"}


class DistributedAttention(torch.nn.Module):
    """`DistributedAttention(local_attention, sequence_process_group, scatter_idx=2,
    gather_idx=0, sp_stream=None)`: q, k and v go from sequence shards to head shards, then
    `local_attention(q, k, v, *args, **kwargs)` runs on the whole sequence and this rank's
    heads, and its output goes back to sequence shards. Differentiable.

    scatter_idx=2, gather_idx=0 (DeepSpeed's pair: scatter heads, gather the sequence, in
    either layout) is the one supported pair; another raises ValueError. `sp_stream` is accepted
    and unused (the all-to-alls are ordered on the caller's stream).
    """

    def __init__(self, local_attention, sequence_process_group, scatter_idx: int = 2,
                 gather_idx: int = 0, sp_stream=None):
        super().__init__()
        if (scatter_idx, gather_idx) != (2, 0):
            raise ValueError(f"scatter_idx={scatter_idx}, gather_idx={gather_idx}: unsupported; "
                             "DistributedAttention supports scatter_idx=2, gather_idx=0 (scatter "
                             "heads, gather the sequence)")
        self.local_attn = local_attention
        self.spg = sequence_process_group
        self.scatter_idx, self.gather_idx = scatter_idx, gather_idx
        self.sp_stream = sp_stream

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                batch_dim_idx: int, rotary_pos_emb=None, *args, **kwargs) -> torch.Tensor:
        """query, key, value: this rank's sequence shards, (b, s/P, h, d) for batch_dim_idx=0 or
        (s/P, b, h, d) for 1. Returns this rank's output in the same layout.

        Raises:
            ValueError for another batch_dim_idx, or a rotary_pos_emb (not supported: apply
            the rotary embedding to the shards before calling, with their global positions).
        """
        if batch_dim_idx not in _LAYOUTS:
            raise ValueError(f"batch_dim_idx={batch_dim_idx!r}: it must be 0 (b, s, h, d) or 1 "
                             "(s, b, h, d)")
        if rotary_pos_emb is not None:
            raise ValueError("rotary_pos_emb is not supported by fast_ulysses' "
                             "DistributedAttention: apply the rotary embedding to the query and "
                             "key shards before calling, with their global positions")
        layout = _LAYOUTS[batch_dim_idx]
        group = group_for(self.spg)
        q, k, v = (group.all_to_all_single_4d(t.contiguous(), 0, None, layout=layout)
                   for t in (query, key, value))
        context = self.local_attn(q, k, v, *args, **kwargs)
        return group.all_to_all_single_4d(context.contiguous(), 1, None, layout=layout)
