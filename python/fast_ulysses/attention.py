"""`UlyssesAttention`: one Ulysses attention (q, k, v to heads, attention, output back to
sequence) as a `torch.nn.Module`, and `group_for`, the registry that turns a torch ProcessGroup
into a fast-ulysses group (used by the module and by `fast_ulysses.integrations`)."""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .api import UlyssesGroupLike
from .errors import FastUlyssesError

# One group per ProcessGroup, built by make_group on first use (a collective: every rank of
# the process group reaches its first use at the same call, by the ordering contract).
_GROUPS: dict = {}


def group_for(group=None) -> UlyssesGroupLike:
    """A fast-ulysses group for `group`.

    Arguments:
        group: a fast-ulysses group (returned as is), a torch ProcessGroup (the registry's
            group for it, built with `fast_ulysses.make_group(group)` on its first use), or
            None (the default process group's).

    Raises:
        ValueError if `group` is neither; RuntimeError if None and torch.distributed is not
        initialised.
    """
    if isinstance(group, UlyssesGroupLike):
        return group
    if group is None:
        if not dist.is_initialized():
            raise RuntimeError("group=None means the default process group, but "
                               "torch.distributed is not initialised: call "
                               "dist.init_process_group first")
        group = dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise FastUlyssesError(f"group is a {type(group).__name__}: it must be a fast-ulysses group "
                         "(make_group), a torch.distributed ProcessGroup or None")
    found = _GROUPS.get(group)
    if found is None or getattr(found, "_destroyed", False):
        from .factory import make_group

        found = _GROUPS[group] = make_group(group)
    return found


# Where each dimension sits in each layout (the all-to-all's, and SDPA's (b, h, s, d)).
def _to_bhsd(layout: str) -> list[int]:
    return [layout.index(c) for c in "bhsd"]


class UlyssesAttention(torch.nn.Module):
    """Ulysses attention over a sequence-parallel group.

    Arguments:
        group: a fast-ulysses group, a torch ProcessGroup (see `group_for`) or None (the
            default process group).
        attn_fn: `attn_fn(q, k, v) -> o` on (b, h, s, d) tensors (each rank's heads, the whole
            sequence); default `torch.nn.functional.scaled_dot_product_attention`.
        tags: the four tags of q, k, v and the output (default "fu.attn.q", ... "fu.attn.o";
            every module may share them: each call's windows are free again when it returns).

    `forward(q, k, v, *, seq_splits=None, head_splits=None, layout="bshd")` takes this rank's
    sequence shards (bshd: (b, seq_splits[r], N, d)), with one head count N for q, k and v,
    and returns this rank's output shaped like q. Without grad, q, k and v travel as borrowed
    calls (barrier=False) closed by one `group.barrier()`; when any of them requires grad they
    travel as owned calls (borrowed results cannot be saved for backward), as they do under
    torch.compile (where `barrier()` cannot run). The output always returns as an owned call.
    """

    def __init__(self, group=None, attn_fn: Callable | None = None,
                 tags: tuple[str, str, str, str] = ("fu.attn.q", "fu.attn.k", "fu.attn.v",
                                                    "fu.attn.o")):
        super().__init__()
        self.group = group
        self.attn_fn = attn_fn if attn_fn is not None else F.scaled_dot_product_attention
        if len(tags) != 4:
            raise FastUlyssesError(f"tags is {tags!r}: it must name 4 tags (q, k, v, output)")
        self.tags = tuple(tags)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                seq_splits=None, head_splits=None, layout: str = "bshd") -> torch.Tensor:
        group = group_for(self.group)
        for name, t in (("k", k), ("v", v)):
            if isinstance(t, torch.Tensor) and isinstance(q, torch.Tensor) and \
                    t.shape != q.shape:
                raise FastUlyssesError(f"{name} has shape {tuple(t.shape)} but q has "
                                 f"{tuple(q.shape)}: q, k and v must have one shape")
        kw = dict(seq_splits=seq_splits, head_splits=head_splits, layout=layout)
        qkv = [t.contiguous() for t in (q, k, v)]
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in qkv)
        if needs_grad or torch.compiler.is_compiling():  # barrier() is eager only
            heads = [group.all_to_all_single_4d(t, 0, tag, **kw)
                     for t, tag in zip(qkv, self.tags)]
        else:
            heads = [group.all_to_all_single_4d_borrowed(t, 0, tag, barrier=False, **kw)
                     for t, tag in zip(qkv, self.tags)]
            group.barrier()
        order = _to_bhsd(layout)  # the plan accepted the layout: it names b, s, h and d
        o = self.attn_fn(*(t.permute(order) for t in heads))
        back = [order.index(i) for i in range(4)]
        o = o.permute(back).contiguous()
        return group.all_to_all_single_4d(o, 1, self.tags[3], **kw)
