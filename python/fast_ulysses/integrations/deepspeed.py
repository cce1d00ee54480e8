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

        rotary_pos_emb: None, or DeepSpeed's `(cos, sin)` pair for the sequence-first layout
        (batch_dim_idx=1), each of shape (b or 1, S, 1, r): after the all-to-all (whole sequence,
        this rank's heads) the first r values of every q and k row are rotated by rotate-half,
        `t * cos + rotate_half(t) * sin` with cos and sin seen as (S, b or 1, 1, r), the other
        d - r pass unchanged; differentiable.

        Raises:
            ValueError for another batch_dim_idx, or a rotary_pos_emb that is not such a pair
            (for batch_dim_idx=0 DeepSpeed's (S, b, 1, r) view does not line up with the
            (b, S, h, d) layout, so it is refused there).
        """
        if batch_dim_idx not in _LAYOUTS:
            raise ValueError(f"batch_dim_idx={batch_dim_idx!r}: it must be 0 (b, s, h, d) or 1 "
                             "(s, b, h, d)")
        layout = _LAYOUTS[batch_dim_idx]
        group = group_for(self.spg)
        q, k, v = (group.all_to_all_single_4d(t.contiguous(), 0, None, layout=layout)
                   for t in (query, key, value))
        if rotary_pos_emb is not None:
            cos, sin = _rotary_views(rotary_pos_emb, batch_dim_idx, q.shape)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        context = self.local_attn(q, k, v, *args, **kwargs)
        return group.all_to_all_single_4d(context.contiguous(), 1, None, layout=layout)


def _rotary_views(rotary_pos_emb, batch_dim_idx: int, shape) -> tuple:
    """DeepSpeed's (cos, sin), each (b or 1, S, 1, r), as (S, b or 1, 1, r) views that line up
    with a (S, b, h, d) tensor of `shape`; ValueError naming the rule otherwise."""
    if batch_dim_idx != 1:
        raise ValueError("rotary_pos_emb with batch_dim_idx=0: DeepSpeed applies it in the "
                         "sequence-first layout only (batch_dim_idx=1); in (b, s, h, d) apply "
                         "the rotary embedding to the shards before the call, at their global "
                         "positions")
    if not (isinstance(rotary_pos_emb, (tuple, list)) and len(rotary_pos_emb) == 2
            and all(isinstance(t, torch.Tensor) for t in rotary_pos_emb)):
        raise ValueError(f"rotary_pos_emb is a {type(rotary_pos_emb).__name__}: it must be a "
                         "(cos, sin) pair of tensors")
    S, b, _, d = shape
    views = []
    for name, t in zip(("cos", "sin"), rotary_pos_emb):
        r = t.shape[-1] if t.dim() == 4 else 0
        if t.dim() != 4 or t.shape[0] not in (1, b) or t.shape[1] != S or t.shape[2] != 1 \
                or r % 2 or not 0 < r <= d:
            raise ValueError(f"rotary_pos_emb's {name} has shape {tuple(t.shape)}: it must be "
                             f"(b or 1, S, 1, r) = ({b} or 1, {S}, 1, r) with an even r <= "
                             f"head_dim {d} (S: the whole sequence)")
        views.append(t.permute(1, 0, 2, 3))
    if views[0].shape != views[1].shape:
        shapes = " and ".join(str(tuple(t.shape)) for t in rotary_pos_emb)
        raise ValueError(f"rotary_pos_emb's cos and sin have shapes {shapes}: they must be the "
                         "same")
    return views[0], views[1]


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first cos.shape[-1] values of each row; the rest pass."""
    r = cos.shape[-1]
    head, rest = t[..., :r], t[..., r:]
    first, second = head.chunk(2, dim=-1)
    rotated = head * cos + torch.cat((-second, first), dim=-1) * sin
    return rotated if rest.shape[-1] == 0 else torch.cat((rotated, rest), dim=-1)
