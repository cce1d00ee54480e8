"""diffusers' context parallelism (Ulysses): `_all_to_all_dim_exchange`, `SeqAllToAllDim`, and
`patch_diffusers()` / `unpatch_diffusers()`, which make `transformer.enable_parallelism(
config=ContextParallelConfig(ulysses_degree=P))` carry every Ulysses all-to-all on fast-ulysses.

diffusers (0.42) runs Ulysses attention in `diffusers.models.attention_dispatch`: the classes
`TemplatedUlyssesAttention` (Ulysses only) and `TemplatedUlyssesAnythingAttention`
(`ulysses_anything=True`), reached from `_templated_context_parallel_attention`, and
`SeqAllToAllDim` (built on `_all_to_all_dim_exchange`) in `_templated_unified_attention`
(ring and Ulysses degrees both above 1). The patch rebinds those four names in that module to
the ones below, which keep diffusers' meaning (the backend's `forward_op` and `backward_op`, the
mask all-gather, `return_lse`) and move q, k, v, the output, the LSE and their gradients on
`fast_ulysses.attention.group_for(ulysses_group)`, with heads and sequence lengths P does not
divide (`head_splits`, `seq_splits`).
"""

from __future__ import annotations

import importlib

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from ..attention import group_for
from ..errors import FastUlyssesError
from ..presets import even_splits
from ._common import exchange
from .diffusers_cpu import cpu_shims, unshim

_MODULE = "diffusers.models.attention_dispatch"
# Each name the patch rebinds, and the function of diffusers' module that must look it up (a
# global read at call time, so rebinding the module's name redirects the call).
_CALLERS = {
    "TemplatedUlyssesAttention": "_templated_context_parallel_attention",
    "TemplatedUlyssesAnythingAttention": "_templated_context_parallel_attention",
    "SeqAllToAllDim": "_templated_unified_attention",
    "_all_to_all_dim_exchange": None,
}
_FORWARD_ARGS = (
    "ctx",
    "query",
    "key",
    "value",
    "attn_mask",
    "dropout_p",
    "is_causal",
    "scale",
    "enable_gqa",
    "return_lse",
    "forward_op",
    "backward_op",
    "_parallel_config",
)
_originals: dict = {}  # name -> diffusers' own object, while patched


def _all_to_all_dim_exchange(
    x: torch.Tensor, scatter_idx: int = 2, gather_idx: int = 1, group=None
) -> torch.Tensor:
    """(B, S_LOCAL, H, D) -> (B, S, H_LOCAL, D) for scatter_idx=2, gather_idx=1; the inverse
    for scatter_idx=1, gather_idx=2. `group`: the sequence-parallel ProcessGroup (None: the
    default group). Differentiable. Heads and sequence split evenly, as in diffusers (the plan's
    error names the rule otherwise). Other index pairs raise FastUlyssesError."""
    return exchange(x, scatter_idx, gather_idx, group)


class SeqAllToAllDim:
    """`SeqAllToAllDim.apply(group, input, scatter_id=2, gather_id=1)`: diffusers' argument
    order for `_all_to_all_dim_exchange`; its backward is the reverse exchange."""

    @staticmethod
    def apply(group, input: torch.Tensor, scatter_id: int = 2, gather_id: int = 1) -> torch.Tensor:
        return _all_to_all_dim_exchange(input, scatter_id, gather_id, group)


# -- Ulysses attention -------------------------------------------------------------------------


def _ready(t: torch.Tensor) -> torch.Tensor:
    """A plain tensor (the backend's ops save their inputs for backward)."""
    return t.wait() if isinstance(t, funcol.AsyncCollectiveTensor) else t


def _lengths(pg, q_len: int, kv_len: int) -> tuple[list[int], list[int]]:
    """Every rank's local query and key lengths (one all_gather of two ints on `pg`, on the CPU
    where its backend takes CPU tensors, as diffusers' own `gather_size_by_comm`)."""
    backend = str(dist.get_backend(pg))
    device = (
        "cpu"
        if "gloo" in backend or "cpu" in backend
        else torch.device("cuda", torch.cuda.current_device())
    )
    mine = torch.tensor([q_len, kv_len], dtype=torch.int64, device=device)
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(pg))]
    dist.all_gather(rows, mine, group=pg)
    rows = [row.tolist() for row in rows]
    return [r[0] for r in rows], [r[1] for r in rows]


def _gather_mask(mask, pg, kv_splits, kv_len, q_total, heads_here, heads):
    """diffusers' rule: a mask whose last dimension is this rank's key length is all-gathered
    along it (each rank's part in rank order). The result must broadcast over this rank's heads
    and every query row, which Ulysses attention sees. Checked before anything is sent (every
    rank holds a mask of one shape, so all raise alike).

    Raises:
        FastUlyssesError: a mask with per-head entries or with rows of the local queries only.
    """
    if mask is None:
        return None
    rows = mask.shape[-2] if mask.dim() >= 2 else 1
    per_head = mask.shape[-3] if mask.dim() >= 3 else 1
    if (
        mask.shape[-1] not in (kv_len, sum(kv_splits))
        or rows not in (1, q_total)
        or (per_head != 1 and heads_here != heads)
    ):
        raise FastUlyssesError(
            f"attn_mask has shape {tuple(mask.shape)}: under Ulysses attention each rank "
            f"attends with all {q_total} query rows and {heads_here} of the {heads} heads, so a "
            f"mask must have 1 or {q_total} rows (dim -2) and broadcast over heads (size 1 in "
            f"dim -3); its last dimension is this rank's key length {kv_len} (all-gathered) or "
            f"the whole key length {sum(kv_splits)}"
        )
    if mask.shape[-1] != kv_len or len(kv_splits) == 1:
        return mask
    width = max(kv_splits)
    padded = torch.nn.functional.pad(mask, (0, width - kv_len)).contiguous()
    parts = [torch.empty_like(padded) for _ in kv_splits]
    dist.all_gather(parts, padded, group=pg)
    return torch.cat([p[..., :n] for p, n in zip(parts, kv_splits)], dim=-1)


def _splits(query, key, value, P: int, pg, uneven_seq: bool):
    """(group keyword arguments for q and for k/v, every rank's key lengths, the query
    length, this rank's heads), checking shapes.

    Raises:
        FastUlyssesError: q, k and v not 4-d (B, S, H, D) with one H, D and B.
    """
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise FastUlyssesError(
                f"{name} has shape {tuple(getattr(t, 'shape', ()))}: "
                "Ulysses attention takes 4-d (B, S_LOCAL, H, D) tensors"
            )
    b, _, h, d = query.shape
    if key.shape != value.shape or (key.shape[0], key.shape[2], key.shape[3]) != (b, h, d):
        raise FastUlyssesError(
            f"query {tuple(query.shape)}, key {tuple(key.shape)} and value "
            f"{tuple(value.shape)}: Ulysses attention needs one batch, head "
            "count and head dim, and key and value of one shape"
        )
    heads = None if h % P == 0 else even_splits(h, P)
    if uneven_seq:
        q_seq, kv_seq = _lengths(pg, query.shape[1], key.shape[1])
    else:  # diffusers' even sharder divided the sequence
        q_seq, kv_seq = [query.shape[1]] * P, [key.shape[1]] * P
    q_kw = dict(seq_splits=None if len(set(q_seq)) == 1 else q_seq, head_splits=heads)
    kv_kw = dict(seq_splits=None if len(set(kv_seq)) == 1 else kv_seq, head_splits=heads)
    heads_here = heads[dist.get_rank(pg)] if heads else h // P
    return q_kw, kv_kw, kv_seq, sum(q_seq), heads_here


def _forward(
    ctx,
    query,
    key,
    value,
    attn_mask,
    dropout_p,
    is_causal,
    scale,
    enable_gqa,
    return_lse,
    forward_op,
    backward_op,
    _parallel_config,
    uneven_seq: bool,
):
    """diffusers' Ulysses attention forward with the all-to-alls on fast-ulysses."""
    pg = _parallel_config.context_parallel_config._ulysses_mesh.get_group()
    group = group_for(pg)
    P = dist.get_world_size(pg)
    q_kw, kv_kw, kv_seq, q_total, heads_here = _splits(query, key, value, P, pg, uneven_seq)
    attn_mask = _gather_mask(
        attn_mask, pg, kv_seq, key.shape[1], q_total, heads_here, query.shape[2]
    )
    ctx.forward_op, ctx.backward_op, ctx._parallel_config = (
        forward_op,
        backward_op,
        _parallel_config,
    )
    ctx._fast_ulysses = (group, q_kw, kv_kw)
    to_heads = [
        _ready(group.all_to_all_single_4d(t.contiguous(), 0, None, **kw))
        for t, kw in ((query, q_kw), (key, kv_kw), (value, kv_kw))
    ]
    out = forward_op(
        ctx,
        *to_heads,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        return_lse,
        _save_ctx=True,
        _parallel_config=_parallel_config,
    )
    lse = None
    if return_lse:
        out, lse, *_ = out
        # (B, S, H_LOCAL) in diffusers' model layout: a head dim of 1 for the all-to-all.
        lse = _ready(
            group.all_to_all_single_4d(lse.unsqueeze(-1).contiguous(), 1, None, **q_kw)
        ).squeeze(-1)
    out = _ready(group.all_to_all_single_4d(out.contiguous(), 1, None, **q_kw))
    return (out, lse) if return_lse else out


def _backward(ctx, grad_out):
    group, q_kw, kv_kw = ctx._fast_ulysses
    grad_out = _ready(group.all_to_all_single_4d(grad_out.contiguous(), 0, None, **q_kw))
    grads = ctx.backward_op(ctx, grad_out)[:3]
    return (
        tuple(
            _ready(group.all_to_all_single_4d(g.contiguous(), 1, None, **kw))
            for g, kw in zip(grads, (q_kw, kv_kw, kv_kw))
        )
        + (None,) * 9
    )


def _attention_function(name: str, anything: bool, doc: str) -> type:
    """An autograd Function named `name` with diffusers' Ulysses attention arguments, running
    `_forward` (with `anything`: the ranks' local lengths gathered per call) and `_backward`."""

    def forward(
        ctx,
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        return_lse,
        forward_op,
        backward_op,
        _parallel_config=None,
    ):
        return _forward(
            ctx,
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            return_lse,
            forward_op,
            backward_op,
            _parallel_config,
            anything,
        )

    def backward(ctx, grad_out, *args):
        return _backward(ctx, grad_out)

    namespace = {"__doc__": doc, "__module__": __name__, "__qualname__": name}
    namespace.update(forward=staticmethod(forward), backward=staticmethod(backward))
    return type(name, (torch.autograd.Function,), namespace)


TemplatedUlyssesAttention = _attention_function(
    "TemplatedUlyssesAttention",
    False,
    """diffusers' `TemplatedUlyssesAttention` (same arguments and results) on fast-ulysses:
    heads P does not divide go as `even_splits(H, P)`; the sequence is evenly sharded by
    diffusers on this path.""",
)
TemplatedUlyssesAnythingAttention = _attention_function(
    "TemplatedUlyssesAnythingAttention",
    True,
    """diffusers' `TemplatedUlyssesAnythingAttention` (`ulysses_anything=True`: any head count,
    ranks holding different sequence lengths) on fast-ulysses, with a backward (diffusers' own
    has none). The local lengths are all-gathered once per call, as diffusers does.""",
)


# -- the patch ---------------------------------------------------------------------------------

_OURS = {
    "TemplatedUlyssesAttention": TemplatedUlyssesAttention,
    "TemplatedUlyssesAnythingAttention": TemplatedUlyssesAnythingAttention,
    "SeqAllToAllDim": SeqAllToAllDim,
    "_all_to_all_dim_exchange": _all_to_all_dim_exchange,
}


def _dispatch_module():
    """diffusers' attention_dispatch module, checked to have the structure the patch rewires.

    Raises:
        FastUlyssesError naming what is missing: diffusers itself, a name, a caller that no
        longer looks the name up, or a forward with other arguments.
    """
    try:
        module = importlib.import_module(_MODULE)
    except ImportError as error:
        raise FastUlyssesError(
            f"patch_diffusers needs diffusers ({_MODULE}), which does not "
            f"import (pip install diffusers): {error}"
        ) from None
    version = getattr(importlib.import_module("diffusers"), "__version__", "?")
    where = f"diffusers {version}: {_MODULE}"
    for name, caller in _CALLERS.items():
        if not hasattr(module, name):
            raise FastUlyssesError(
                f"{where} has no {name}: this diffusers' context parallelism "
                "is not the one patch_diffusers rewires"
            )
        code = getattr(getattr(module, caller, None), "__code__", None) if caller else None
        if caller and (code is None or name not in code.co_names):
            raise FastUlyssesError(
                f"{where}.{caller} does not call {name}: this diffusers' "
                "context parallelism is not the one patch_diffusers rewires"
            )
    for name in ("TemplatedUlyssesAttention", "TemplatedUlyssesAnythingAttention"):
        forward = getattr(module, name).forward
        args = forward.__code__.co_varnames[: forward.__code__.co_argcount]
        if tuple(args) != _FORWARD_ARGS:
            raise FastUlyssesError(
                f"{where}.{name}.forward takes {args}, not {_FORWARD_ARGS}: "
                "patch_diffusers cannot stand in for it"
            )
    return module


def patch_diffusers() -> list[str]:
    """Rebinds `TemplatedUlyssesAttention`, `TemplatedUlyssesAnythingAttention`,
    `SeqAllToAllDim` and `_all_to_all_dim_exchange` in diffusers.models.attention_dispatch to
    fast-ulysses', so diffusers' context parallelism carries every Ulysses all-to-all on
    `group_for(its Ulysses group)`. Call it once per process, before or after
    `enable_parallelism`; calling it again changes nothing. `unpatch_diffusers()` undoes it.
    It also applies what diffusers needs on CPU ranks over gloo (`diffusers_cpu.cpu_shims`: each only where
    needed, none on the all-to-all path), so the same lines run on a machine without a GPU.

    Returns:
        The rebound names, as "module.name".

    Raises:
        FastUlyssesError if diffusers does not import, or its module lacks a name the patch
        rewires or calls it from elsewhere (the message names it).
    """
    module = _dispatch_module()
    for name, ours in _OURS.items():
        if getattr(module, name) is not ours:
            _originals[name] = getattr(module, name)
            setattr(module, name, ours)
    cpu_shims()
    return [f"{_MODULE}.{name}" for name in _OURS]


def unpatch_diffusers() -> list[str]:
    """Puts back diffusers' own objects where `patch_diffusers()` rebound them, and undoes its
    CPU shims.

    Returns:
        The restored names, as "module.name" (none when nothing was patched).
    """
    unshim()
    if not _originals:
        return []
    module = importlib.import_module(_MODULE)
    restored = []
    for name, original in list(_originals.items()):
        setattr(module, name, original)
        restored.append(f"{_MODULE}.{name}")
        del _originals[name]
    return restored
