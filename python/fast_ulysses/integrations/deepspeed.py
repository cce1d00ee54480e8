"""DeepSpeed-Ulysses: `DistributedAttention`."""

from __future__ import annotations

import torch

from ..attention import group_for
from ..errors import FastUlyssesError

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
            raise FastUlyssesError(f"scatter_idx={scatter_idx}, gather_idx={gather_idx}: unsupported; "
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

        rotary_pos_emb: None, or DeepSpeed's `(cos, sin)` pair of 4-d tables. As DeepSpeed does,
        each is viewed as `table.permute(1, 0, 2, 3)`, which must broadcast to the first r values
        of q after the all-to-all (whole sequence S, this rank's heads): (S, b or 1, 1, r) tables
        for batch_dim_idx=0, (b or 1, S, 1, r) for 1, with an even r <= d. Then the first r
        values of every q and k row become `t * cos + rotate_half(t) * sin`, the other d - r
        pass unchanged; differentiable.

        Raises:
            ValueError for another batch_dim_idx, or a rotary_pos_emb that is not such a pair
            (before anything is sent).
        """
        if batch_dim_idx not in _LAYOUTS:
            raise FastUlyssesError(f"batch_dim_idx={batch_dim_idx!r}: it must be 0 (b, s, h, d) or 1 "
                             "(s, b, h, d)")
        layout = _LAYOUTS[batch_dim_idx]
        group = group_for(self.spg)
        rotary = None
        if rotary_pos_emb is not None:
            rotary = _rotary_views(rotary_pos_emb, _head_shard_shape(query, batch_dim_idx,
                                                                     group.world_size))
        q, k, v = (group.all_to_all_single_4d(t.contiguous(), 0, None, layout=layout)
                   for t in (query, key, value))
        if rotary is not None:
            q, k = _rotate(q, *rotary), _rotate(k, *rotary)
        context = self.local_attn(q, k, v, *args, **kwargs)
        return group.all_to_all_single_4d(context.contiguous(), 1, None, layout=layout)


def _head_shard_shape(query, batch_dim_idx: int, P: int) -> tuple:
    """q's shape after the all-to-all: (b, S, h/P, d) or (S, b, h/P, d)."""
    if not isinstance(query, torch.Tensor) or query.dim() != 4:
        raise FastUlyssesError(f"query has shape {tuple(getattr(query, 'shape', ()))}: it must be 4-d")
    if batch_dim_idx == 0:
        b, s, h, d = query.shape
        return b, s * P, h // P, d
    s, b, h, d = query.shape
    return s * P, b, h // P, d


def _rotary_views(rotary_pos_emb, q_shape) -> tuple:
    """DeepSpeed's (cos, sin) tables as the views it applies, `table.permute(1, 0, 2, 3)`;
    ValueError naming the rule unless each broadcasts to q's first r values (q_shape: q after
    the all-to-all) with an even r <= d."""
    if not (isinstance(rotary_pos_emb, (tuple, list)) and len(rotary_pos_emb) == 2
            and all(isinstance(t, torch.Tensor) for t in rotary_pos_emb)):
        raise FastUlyssesError(f"rotary_pos_emb is a {type(rotary_pos_emb).__name__}: it must be a "
                         "(cos, sin) pair of tensors")
    d = q_shape[-1]
    views = []
    for name, t in zip(("cos", "sin"), rotary_pos_emb):
        view = t.permute(1, 0, 2, 3) if t.dim() == 4 else t
        r = view.shape[-1] if t.dim() == 4 else 0
        target = (*q_shape[:3], r)
        if t.dim() != 4 or r % 2 or not 0 < r <= d or any(
                n not in (1, m) for n, m in zip(view.shape[:3], target)):
            raise FastUlyssesError(
                f"rotary_pos_emb's {name} has shape {tuple(t.shape)}: DeepSpeed applies it as "
                f"{name}.permute(1, 0, 2, 3), which must broadcast to q's first r values after "
                f"the all-to-all, {target} (each of the first three dimensions 1 or equal), "
                f"with an even r <= head_dim {d}")
        views.append(view)
    if views[0].shape != views[1].shape:
        shapes = " and ".join(str(tuple(t.shape)) for t in rotary_pos_emb)
        raise FastUlyssesError(f"rotary_pos_emb's cos and sin have shapes {shapes}: they must be the "
                         "same")
    return views[0], views[1]


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first cos.shape[-1] values of each row; the rest pass."""
    r = cos.shape[-1]
    head, rest = t[..., :r], t[..., r:]
    first, second = head.chunk(2, dim=-1)
    rotated = head * cos + torch.cat((-second, first), dim=-1) * sin
    return rotated if rest.shape[-1] == 0 else torch.cat((rotated, rest), dim=-1)
