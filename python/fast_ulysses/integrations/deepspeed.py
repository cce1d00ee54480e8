"""DeepSpeed-Ulysses: `DistributedAttention`."""

from __future__ import annotations

import torch

from ..attention import group_for
from ..errors import FastUlyssesError

# batch_dim_idx -> layout: 0 = (b, s, h, d), 1 = (s, b, h, d).
_LAYOUTS = {0: "bshd", 1: "sbhd"}


def _mode(idx) -> int:
    """DeepSpeed 0.19.8's rule for one all-to-all (`_generate_layout_params`): an index below 2
    scatters the sequence and gathers heads (our mode 1), any other scatters heads and gathers
    the sequence (mode 0)."""
    return 1 if idx < 2 else 0


class _NoBackward(torch.autograd.Function):
    """Identity forward; backward raises: DeepSpeed's own backward fails for the pair."""

    @staticmethod
    def forward(ctx, x, message):
        ctx.message = message
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        raise FastUlyssesError(ctx.message)


class DistributedAttention(torch.nn.Module):
    """`DistributedAttention(local_attention, sequence_process_group, scatter_idx=2,
    gather_idx=0, sp_stream=None, num_kv_heads=None)`, DeepSpeed 0.19.8's signature and
    semantics: q, k and v each go through one all-to-all, then
    `local_attention(q, k, v, *args, **kwargs)` runs, and its output goes through one more.
    Differentiable.

    Supported, bit for bit like DeepSpeed 0.19.8's even-heads path, forward and backward:
    - every int pair (scatter_idx, gather_idx). As in DeepSpeed, only `idx < 2` matters: the
      q/k/v all-to-all scatters the sequence and gathers heads when scatter_idx < 2, else
      scatters heads and gathers the sequence (the DeepSpeed default, 2, and e.g. (2, 1) are
      that); the output all-to-all does the same by gather_idx. Each one's backward is the
      all-to-all DeepSpeed runs there: by gather_idx for q/k/v, by scatter_idx for the output.
      So pairs with one index below 2 and the other not (e.g. (2, 0), (2, 1), (3, 0),
      (1, 2), (0, 3)) are differentiable. Pairs on the same side (e.g. (2, 2), (0, 1)) run
      the same direction twice: the forward matches DeepSpeed's (a differently shaped
      output), and at P > 1 backward raises FastUlyssesError, where DeepSpeed's backward fails
      too; at P = 1 every pair is the identity exchange and differentiable.
    - batch_dim_idx 0 ((b, s, h, d)) and 1 ((s, b, h, d)) in forward.
    - rotary_pos_emb (see forward).

    Raises FastUlyssesError where DeepSpeed errors: a heads count the scattered dimension
    does not divide by P, a sequence length not divisible by P where the sequence is
    scattered, and num_kv_heads (the constructor's, else key.shape[2]) below P.

    Left out: DeepSpeed's uneven-heads path (num_kv_heads, else key.shape[2], not divisible
    by P) raises FastUlyssesError; batch_dim_idx other than 0 or 1 (DeepSpeed's even path
    takes any other value as 1) raises FastUlyssesError; a non-int index raises
    FastUlyssesError. `sp_stream` is accepted and unused (the all-to-alls are ordered on the
    caller's stream; DeepSpeed's overlap path gives the same values).
    """

    def __init__(self, local_attention, sequence_process_group, scatter_idx: int = 2,
                 gather_idx: int = 0, sp_stream=None, num_kv_heads: int | None = None):
        super().__init__()
        for name, idx in (("scatter_idx", scatter_idx), ("gather_idx", gather_idx)):
            if not isinstance(idx, int):
                raise FastUlyssesError(f"{name}={idx!r}: it must be an int")
        if num_kv_heads is not None and not (isinstance(num_kv_heads, int) and num_kv_heads > 0):
            raise FastUlyssesError(f"num_kv_heads={num_kv_heads!r}: it must be None or a "
                                   "positive int")
        self.local_attn = local_attention
        self.spg = sequence_process_group
        self.scatter_idx, self.gather_idx = scatter_idx, gather_idx
        self.num_kv_heads = num_kv_heads
        self.sp_stream = sp_stream

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                batch_dim_idx: int, rotary_pos_emb=None, *args, **kwargs) -> torch.Tensor:
        """query, key, value: 4-d, (b, s, h, d) for batch_dim_idx=0 or (s, b, h, d) for 1.
        With scatter_idx >= 2 (the default) these are sequence shards with all heads; with
        scatter_idx < 2 the whole sequence with this rank's heads. Returns the output after
        the all-to-all that gather_idx picks (see the class), in the same layout.

        rotary_pos_emb: None, or DeepSpeed's `(cos, sin)` pair of 4-d tables. As DeepSpeed does,
        each is viewed as `table.permute(1, 0, 2, 3)`, which must broadcast to the first r values
        of q after its all-to-all: for the default direction (whole sequence S, this rank's
        heads) (S, b or 1, 1, r) tables for batch_dim_idx=0, (b or 1, S, 1, r) for 1, with an
        even r <= d. Then the first r values of every q and k row become
        `t * cos + rotate_half(t) * sin`, the other d - r pass unchanged; differentiable.

        Raises:
            FastUlyssesError for another batch_dim_idx, a rotary_pos_emb that is not such a
            pair, uneven heads, or a shape DeepSpeed refuses (before anything is sent).
        """
        if batch_dim_idx not in _LAYOUTS:
            raise FastUlyssesError(f"batch_dim_idx={batch_dim_idx!r}: it must be 0 (b, s, h, d) or 1 "
                             "(s, b, h, d)")
        layout = _LAYOUTS[batch_dim_idx]
        group = group_for(self.spg)
        P = group.world_size
        if not isinstance(key, torch.Tensor) or key.dim() != 4:
            raise FastUlyssesError(f"key has shape {tuple(getattr(key, 'shape', ()))}: it must be 4-d")
        # DeepSpeed's partition basis for all four all-to-alls.
        kv_heads = self.num_kv_heads if self.num_kv_heads is not None else key.shape[2]
        source = "num_kv_heads" if self.num_kv_heads is not None else "key.shape[2]"
        if kv_heads < P:
            raise FastUlyssesError(f"{source}={kv_heads}: DeepSpeed needs at least the sequence "
                                   f"parallel size P={P} key-value heads")
        if kv_heads % P:
            raise FastUlyssesError(f"{source}={kv_heads} is not divisible by P={P}: DeepSpeed's "
                                   "uneven-heads path is not supported")
        mode_in, mode_out = _mode(self.scatter_idx), _mode(self.gather_idx)
        rotary = None
        if rotary_pos_emb is not None:
            rotary = _rotary_views(rotary_pos_emb, _exchanged_shape(query, batch_dim_idx, P,
                                                                    mode_in))
        q, k, v = (group.all_to_all_single_4d(t.contiguous(), mode_in, None, layout=layout)
                   for t in (query, key, value))
        if rotary is not None:
            q, k = _rotate(q, *rotary), _rotate(k, *rotary)
        context = self.local_attn(q, k, v, *args, **kwargs)
        out = group.all_to_all_single_4d(context.contiguous(), mode_out, None, layout=layout)
        if mode_in == mode_out and P > 1 and torch.is_grad_enabled() and out.requires_grad:
            out = _NoBackward.apply(out, (
                f"DistributedAttention(scatter_idx={self.scatter_idx}, "
                f"gather_idx={self.gather_idx}): no backward at P={P}; both all-to-alls scatter "
                f"the {'heads' if mode_in == 0 else 'sequence'}, and DeepSpeed's backward fails "
                "for such a pair too (one index must be below 2, the other not)"))
        return out


def _exchanged_shape(query, batch_dim_idx: int, P: int, mode: int) -> tuple:
    """q's shape after its all-to-all: mode 0 (b, s*P, h/P, d), mode 1 (b, s/P, h*P, d);
    sbhd swaps the first two."""
    if not isinstance(query, torch.Tensor) or query.dim() != 4:
        raise FastUlyssesError(f"query has shape {tuple(getattr(query, 'shape', ()))}: it must be 4-d")
    if batch_dim_idx == 0:
        b, s, h, d = query.shape
    else:
        s, b, h, d = query.shape
    s, h = (s * P, h // P) if mode == 0 else (s // P, h * P)
    return (b, s, h, d) if batch_dim_idx == 0 else (s, b, h, d)


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
