"""DeepSpeed-Ulysses: `DistributedAttention`."""

from __future__ import annotations

import torch

from ..attention import group_for
from ..errors import FastUlyssesError
from ._common import check_tensor, is_int, world_of

# batch_dim_idx -> layout: 0 = (b, s, h, d), 1 = (s, b, h, d).
_LAYOUTS = {0: "bshd", 1: "sbhd"}
_SHAPES = {0: "b, s, h, d", 1: "s, b, h, d"}


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

    Supported, bit for bit like DeepSpeed 0.19.8, forward and backward:
    - every int pair (scatter_idx, gather_idx) with even heads. As in DeepSpeed, only
      `idx < 2` matters: the q/k/v all-to-all scatters the sequence and gathers heads when
      scatter_idx < 2, else scatters heads and gathers the sequence (the DeepSpeed default, 2,
      and e.g. (2, 1) are that); the output all-to-all does the same by gather_idx. Each one's
      backward is the all-to-all DeepSpeed runs there: by gather_idx for q/k/v, by scatter_idx
      for the output. So pairs with one index below 2 and the other not (e.g. (2, 0), (2, 1),
      (3, 0), (1, 2), (0, 3)) are differentiable. Pairs on the same side (e.g. (2, 2), (0, 1))
      run the same direction twice: the forward matches DeepSpeed's (a differently shaped
      output), and at P > 1 backward raises FastUlyssesError, where DeepSpeed's backward fails
      too; at P = 1 every pair is the identity exchange and differentiable.
    - uneven heads (DeepSpeed's `uneven_heads_all2all`): num_kv_heads (the constructor's, else
      key.shape[2]) not divisible by P. Rank r holds num_kv_heads // P key-value heads, one more
      for r < num_kv_heads % P, and, of a tensor with g * num_kv_heads heads, the g-fold
      (contiguous heads, in rank order): our head_splits. DeepSpeed indexes the tensor by
      scatter_idx and gather_idx on this path, so it runs with the heads dimension (2) and the
      sequence dimension of the layout only: (2, 1) and (1, 2) for batch_dim_idx=0, (2, 0) and
      (0, 2) for 1. DeepSpeed takes each rank's share from its global sequence-parallel rank
      (deepspeed.utils.groups, set by its mpu); this takes it from `sequence_process_group`,
      the same where DeepSpeed's is right (its mpu's group is the one passed in).
    - batch_dim_idx 0 ((b, s, h, d)) and 1 ((s, b, h, d)) in forward.
    - rotary_pos_emb (see forward).

    Raises FastUlyssesError where DeepSpeed errors: a heads count the scattered dimension
    does not divide by P (even path), a sequence length not divisible by P where the sequence
    is scattered, num_kv_heads (the constructor's, else key.shape[2]) below P; on the uneven
    path another index pair, a tensor whose heads are not a multiple of num_kv_heads (of this
    rank's share where heads are gathered), and the shapes for which DeepSpeed's float
    arithmetic of its receive buffer comes out one short (see `_Uneven`): in forward before
    that all-to-all is sent, in backward when it is reached (DeepSpeed fails there: one rank
    raises, the others wait in the collective).

    Left out: batch_dim_idx other than 0 or 1 (DeepSpeed's even path takes any other value as
    1) raises FastUlyssesError; a non-int index raises FastUlyssesError. `sp_stream` is
    accepted and unused (the all-to-alls are ordered on the caller's stream; DeepSpeed's
    overlap path gives the same values).
    """

    def __init__(
        self,
        local_attention,
        sequence_process_group,
        scatter_idx: int = 2,
        gather_idx: int = 0,
        sp_stream=None,
        num_kv_heads: int | None = None,
    ):
        super().__init__()
        for name, idx in (("scatter_idx", scatter_idx), ("gather_idx", gather_idx)):
            if not is_int(idx):
                raise FastUlyssesError(f"{name}={idx!r}: it must be an int (not a bool or float)")
        if num_kv_heads is not None and not (is_int(num_kv_heads) and num_kv_heads > 0):
            raise FastUlyssesError(
                f"num_kv_heads={num_kv_heads!r}: it must be None or a positive int"
            )
        self.local_attn = local_attention
        self.spg = sequence_process_group
        self.scatter_idx, self.gather_idx = int(scatter_idx), int(gather_idx)
        self.num_kv_heads = None if num_kv_heads is None else int(num_kv_heads)
        self.sp_stream = sp_stream

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        batch_dim_idx: int,
        rotary_pos_emb=None,
        *args,
        **kwargs,
    ) -> torch.Tensor:
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
            FastUlyssesError for another batch_dim_idx (an int, not a bool), a query, key or
            value that is not a 4-d tensor, a local_attention that is not callable, a
            rotary_pos_emb that is not such a pair, or a shape DeepSpeed refuses (each before
            the all-to-all it concerns is sent; where DeepSpeed's uneven-heads backward fails,
            in backward); and a local attention whose output is not a 4-d tensor.
        """
        if not is_int(batch_dim_idx) or int(batch_dim_idx) not in _LAYOUTS:
            raise FastUlyssesError(
                f"batch_dim_idx={batch_dim_idx!r}: it must be 0 (b, s, h, d) or 1 (s, b, h, d)"
            )
        batch_dim_idx = int(batch_dim_idx)
        layout = _LAYOUTS[batch_dim_idx]
        for name, t in (("query", query), ("key", key), ("value", value)):
            check_tensor(name, t, 4, f"it must be a 4-d tensor ({_SHAPES[batch_dim_idx]})")
        P, rank = world_of(self.spg)  # the group itself (a collective) after the checks
        # DeepSpeed's partition basis for all four all-to-alls.
        kv_heads = self.num_kv_heads if self.num_kv_heads is not None else key.shape[2]
        source = "num_kv_heads" if self.num_kv_heads is not None else "key.shape[2]"
        if kv_heads < P:
            raise FastUlyssesError(
                f"{source}={kv_heads}: DeepSpeed needs at least the sequence "
                f"parallel size P={P} key-value heads"
            )
        mode_in, mode_out = _mode(self.scatter_idx), _mode(self.gather_idx)
        uneven = None
        if kv_heads % P:
            uneven = _Uneven(
                kv_heads, P, rank, source, self.scatter_idx, self.gather_idx, batch_dim_idx
            )
        splits = [
            uneven.splits(name, t, mode_in) if uneven else None
            for name, t in (("query", query), ("key", key), ("value", value))
        ]
        rotary = None
        if rotary_pos_emb is not None:
            rotary = _rotary_views(
                rotary_pos_emb,
                _exchanged_shape(
                    query, batch_dim_idx, P, mode_in, splits[0][rank] if uneven else None
                ),
            )
        if not callable(self.local_attn):
            raise FastUlyssesError(
                f"local_attention is {self.local_attn!r}: it must be callable, as "
                "local_attention(q, k, v, *args, **kwargs)"
            )
        group = group_for(self.spg)
        q, k, v = (
            group.all_to_all_single_4d(t.contiguous(), mode_in, None, head_splits=hs, layout=layout)
            for t, hs in zip((query, key, value), splits)
        )
        if uneven and mode_in == 0:  # the backward gathers heads
            q, k, v = (
                uneven.guard_backward(name, t)
                for name, t in (("query", q), ("key", k), ("value", v))
            )
        if rotary is not None:
            q, k = _rotate(q, *rotary), _rotate(k, *rotary)
        context = self.local_attn(q, k, v, *args, **kwargs)
        check_tensor(
            "the local attention's output",
            context,
            4,
            f"it must be a 4-d tensor ({_SHAPES[batch_dim_idx]}), like q",
        )
        out_splits = (
            uneven.splits("the local attention's output", context, mode_out) if uneven else None
        )
        out = group.all_to_all_single_4d(
            context.contiguous(), mode_out, None, head_splits=out_splits, layout=layout
        )
        if uneven and mode_out == 0:
            out = uneven.guard_backward("the local attention's output", out)
        if mode_in == mode_out and P > 1 and torch.is_grad_enabled() and out.requires_grad:
            out = _NoBackward.apply(
                out,
                (
                    f"DistributedAttention(scatter_idx={self.scatter_idx}, "
                    f"gather_idx={self.gather_idx}): no backward at P={P}; both all-to-alls scatter "
                    f"the {'heads' if mode_in == 0 else 'sequence'}, and DeepSpeed's backward fails "
                    "for such a pair too (one index must be below 2, the other not)"
                ),
            )
        return out


class _Uneven:
    """DeepSpeed 0.19.8's uneven-heads partition (`uneven_heads_all2all`, shares from
    `get_shard_size_list(n, P, AutoTPMeta(num_kv_heads=kv))`): rank r holds kv // P key-value
    heads, one more for r < kv % P; a tensor of g * kv heads is split g-fold. Where it gathers
    heads, DeepSpeed sizes its receive buffer and the result's head count in floats,
    `int(kv / share * n)`; for some shapes (e.g. kv = 13 on 2 ranks, a share of 6, 9 values a
    head and sequence row) that comes out one short on a rank, and its all-to-all or reshape
    fails there while the other ranks wait in the collective. `gather_failure` finds those
    shapes, for every rank's share, so that every rank refuses them."""

    def __init__(self, kv, P, rank, source, scatter_idx, gather_idx, batch_dim_idx):
        self.seq = 1 if batch_dim_idx == 0 else 0
        if (scatter_idx, gather_idx) not in ((2, self.seq), (self.seq, 2)):
            raise FastUlyssesError(
                f"scatter_idx={scatter_idx}, gather_idx={gather_idx} with batch_dim_idx="
                f"{batch_dim_idx}: {source}={kv} is not divisible by P={P}, and DeepSpeed's "
                "uneven-heads path indexes the tensor by them, so it runs with (2, "
                f"{self.seq}) or ({self.seq}, 2) only (the heads and sequence dimensions of "
                "this layout)"
            )
        self.kv, self.P, self.rank, self.source = kv, P, rank, source
        self.shares = [kv // P + (1 if r < kv % P else 0) for r in range(P)]

    def splits(self, name, x, mode) -> list[int]:
        """head_splits for x's all-to-all in `mode` (0: x holds every head, 1: this rank's).

        Raises:
            FastUlyssesError unless x's heads are a multiple of kv (of this rank's share in
            mode 1), or where DeepSpeed's forward gather fails (mode 1)."""
        heads, share = x.shape[2], self.shares[self.rank]
        if heads % (self.kv if mode == 0 else share):
            which = (
                "heads"
                if mode == 0
                else f"heads on rank {self.rank}, whose share of the {self.kv} is {share}"
            )
            raise FastUlyssesError(
                f"{name} has {heads} {which}: DeepSpeed's uneven-heads path ({self.source}="
                f"{self.kv}, P={self.P}) splits a tensor of g * {self.kv} heads as g * "
                f"{self.shares}, so its heads must be a multiple of the key-value heads"
            )
        g = heads // (self.kv if mode == 0 else share)
        failure = (
            self.gather_failure(g, x.shape[self.seq] // self.P, x.shape[3]) if mode == 1 else ""
        )
        if failure:
            raise FastUlyssesError(f"{name}: {failure}")
        return [g * s for s in self.shares]

    def gather_failure(self, g, local_seq, d) -> str:
        """Why DeepSpeed's gather of g * kv heads of d values, local_seq rows a rank, fails on
        some rank; "" where it runs."""
        n = local_seq * g * d  # values a head, per rank's rows
        for share in sorted(set(self.shares)):
            scale = self.kv / share
            if int(scale * (share * n)) != self.kv * n or int(g * share * scale) != g * self.kv:
                return (
                    f"DeepSpeed's uneven-heads gather fails here: with {self.source}="
                    f"{self.kv} on P={self.P} ranks, a rank whose share is {share} sizes "
                    f"its receive buffer and head count as int({self.kv} / {share} * n), "
                    f"which is one short for {g * self.kv} heads of head_dim {d} and "
                    f"{local_seq} rows a rank"
                )
        return ""

    def guard_backward(self, name, y):
        """y, the result of a mode 0 call, whose backward gathers heads: its gradient raises
        FastUlyssesError where DeepSpeed's backward fails (see `gather_failure`)."""
        failure = self.gather_failure(
            y.shape[2] // self.shares[self.rank], y.shape[self.seq] // self.P, y.shape[3]
        )
        if failure and torch.is_grad_enabled() and y.requires_grad:
            return _NoBackward.apply(y, f"{name}: no backward: {failure}")
        return y


def _exchanged_shape(query, batch_dim_idx: int, P: int, mode: int, heads=None) -> tuple:
    """q's shape after its all-to-all: mode 0 (b, s*P, h/P, d), mode 1 (b, s/P, h*P, d), with
    `heads` (uneven splits) for h/P or h*P; sbhd swaps the first two."""
    if not isinstance(query, torch.Tensor) or query.dim() != 4:
        raise FastUlyssesError(
            f"query has shape {tuple(getattr(query, 'shape', ()))}: it must be 4-d"
        )
    if batch_dim_idx == 0:
        b, s, h, d = query.shape
    else:
        s, b, h, d = query.shape
    s, h = (s * P, h // P) if mode == 0 else (s // P, h * P)
    h = h if heads is None else heads
    return (b, s, h, d) if batch_dim_idx == 0 else (s, b, h, d)


def _rotary_views(rotary_pos_emb, q_shape) -> tuple:
    """DeepSpeed's (cos, sin) tables as the views it applies, `table.permute(1, 0, 2, 3)`;
    ValueError naming the rule unless each broadcasts to q's first r values (q_shape: q after
    the all-to-all) with an even r <= d."""
    if not (
        isinstance(rotary_pos_emb, (tuple, list))
        and len(rotary_pos_emb) == 2
        and all(isinstance(t, torch.Tensor) for t in rotary_pos_emb)
    ):
        raise FastUlyssesError(
            f"rotary_pos_emb is a {type(rotary_pos_emb).__name__}: it must be a "
            "(cos, sin) pair of tensors"
        )
    d = q_shape[-1]
    views = []
    for name, t in zip(("cos", "sin"), rotary_pos_emb):
        view = t.permute(1, 0, 2, 3) if t.dim() == 4 else t
        r = view.shape[-1] if t.dim() == 4 else 0
        target = (*q_shape[:3], r)
        if (
            t.dim() != 4
            or r % 2
            or not 0 < r <= d
            or any(n not in (1, m) for n, m in zip(view.shape[:3], target))
        ):
            raise FastUlyssesError(
                f"rotary_pos_emb's {name} has shape {tuple(t.shape)}: DeepSpeed applies it as "
                f"{name}.permute(1, 0, 2, 3), which must broadcast to q's first r values after "
                f"the all-to-all, {target} (each of the first three dimensions 1 or equal), "
                f"with an even r <= head_dim {d}"
            )
        views.append(view)
    if views[0].shape != views[1].shape:
        shapes = " and ".join(str(tuple(t.shape)) for t in rotary_pos_emb)
        raise FastUlyssesError(
            f"rotary_pos_emb's cos and sin have shapes {shapes}: they must be the same"
        )
    return views[0], views[1]


def _rotate(t: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first cos.shape[-1] values of each row; the rest pass."""
    r = cos.shape[-1]
    head, rest = t[..., :r], t[..., r:]
    first, second = head.chunk(2, dim=-1)
    rotated = head * cos + torch.cat((-second, first), dim=-1) * sin
    return rotated if rest.shape[-1] == 0 else torch.cat((rotated, rest), dim=-1)
