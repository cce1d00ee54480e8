"""`UlyssesAttention`: one Ulysses attention (q, k, v to heads, attention, output back to
sequence) as a `torch.nn.Module`, and `group_for`, the registry that turns a torch ProcessGroup
into a fast-ulysses group (used by the module and by `fast_ulysses.integrations`)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .arguments import as_splits, check_tags
from .errors import FastUlyssesError, refused
from .factory import UlyssesGroupLike
from .head_groups import check_pipeline, expand_kv, head_groups, kv_send, q_send
from .plan import LAYOUTS, cached_plan, plan
from .ring import ring_attention
from .wire import WireCalls, check_wire_dtype

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
            raise RuntimeError(
                "group=None means the default process group, but "
                "torch.distributed is not initialised: call "
                "dist.init_process_group first"
            )
        group = dist.group.WORLD
    if not isinstance(group, dist.ProcessGroup):
        raise FastUlyssesError(
            f"group is a {type(group).__name__}: it must be a fast-ulysses group "
            "(make_group), a torch.distributed ProcessGroup or None"
        )
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
            sequence); default `torch.nn.functional.scaled_dot_product_attention`. With
            grouped-query k and v, the default gets this rank's kv heads and
            `enable_gqa=True` where every rank's kv heads serve equally many q heads each;
            otherwise (and any other attn_fn always) k and v come with q's head count, each
            kv head repeated for the q heads that use it. It must return a tensor of shape
            (b, h, s, d_v), its q's b, h and s and v's head dim (SDPA's output; checked per
            call).
        tags: the four tags of q, k, v and the output (default "fu.attn.q", ... "fu.attn.o";
            every module may share them: each call's windows are free again when it returns).
        pipeline: G >= 1 head groups (1: no pipeline). Group g + 1's q, k and v all-to-alls
            are issued before group g's attention, and group g's output all-to-all before
            group g + 1's attention, so on UlyssesGroup (eager, P > 1, where results are
            `AsyncCollectiveTensor`s) the copy engines move one group while the SMs attend to
            another. Every call is owned. G must be at most the largest per-rank q head count
            (checked per call).
        ring_group: a torch ProcessGroup over which the sequence is also split in ring blocks
            (Ulysses x Ring, "USP"), or None: the group's own `ring_group` attribute where it
            has one (`make_group` on a mesh or a pair of groups), else no ring. A ring of one
            rank is no ring (today's calls, unchanged). With a ring, the Ulysses calls are the
            same; attention is `fast_ulysses.ring_attention` over the ring, each rank's q over
            every ring rank's k and v; attn_fn, if given, must return (out, lse). The ranks of
            one ring hold the same Ulysses position (they must get the same heads: the same
            head_splits; checked on the first ring step, on every rank).
        wire_dtype: None, or an FP8 wire dtype in which q, k, v and the output travel
            (`fast_ulysses.wire`; every call then goes as an owned call and is dequantized to
            q's dtype); the backward moves gradients in q's dtype.

    `forward(q, k, v, *, seq_splits=None, head_splits=None, layout="bshd")` takes this rank's
    sequence shards (bshd: (b, seq_splits[r], N, d)); k and v have one shape, q's or q's with
    fewer heads (grouped-query / multi-query attention: q's head count a multiple of theirs, q
    head i using kv head i // (Hq // Hkv)); it returns this rank's output shaped like q.
    head_splits splits q's heads; each rank receives only the kv heads its q heads use
    (`fast_ulysses.head_groups`). Without grad, q, k and v travel as borrowed calls
    (barrier=False) closed by one `group.barrier()`, unless pipelined; when any of them
    requires grad they travel as owned calls (borrowed results cannot be saved for backward),
    as they do under torch.compile (where `barrier()` cannot run). The output always returns
    as an owned call.

    Raises:
        FastUlyssesError: `attn_fn` not callable, `tags` not 4 different tags, `pipeline` not
        an int >= 1 (here); q, k or v not a 4-d tensor, of another dtype or device than q's; k
        and v of different shapes, of another shape than q's but for heads, or with a head
        count that does not divide q's; splits that are not sequences of ints; pipeline past
        the largest per-rank q head count (all before any call); attn_fn's result not a tensor
        of its shape (before the output's call); and every rule of the group's calls (forward).
        With a ring: q heads fewer than the group's size without head_splits (before any
        call), and `ring_attention`'s rules.
    """

    def __init__(
        self,
        group=None,
        attn_fn: Callable | None = None,
        tags: tuple[str, str, str, str] = ("fu.attn.q", "fu.attn.k", "fu.attn.v", "fu.attn.o"),
        *,
        pipeline: int = 1,
        ring_group=None,
        wire_dtype=None,
    ):
        super().__init__()
        if wire_dtype is not None:
            check_wire_dtype(wire_dtype)
        self.wire_dtype = wire_dtype
        if attn_fn is not None and not callable(attn_fn):
            raise FastUlyssesError(
                f"attn_fn is {attn_fn!r}: it must be a callable attn_fn(q, k, v) -> o, or None "
                "(torch.nn.functional.scaled_dot_product_attention)"
            )
        self.group = group
        self.attn_fn = attn_fn if attn_fn is not None else F.scaled_dot_product_attention
        self.tags = check_tags(tags, ("q", "k", "v", "output"))
        self.pipeline = check_pipeline(pipeline)
        if ring_group is not None and not isinstance(ring_group, dist.ProcessGroup):
            raise FastUlyssesError(
                f"ring_group is a {type(ring_group).__name__}: it must be a torch.distributed "
                "ProcessGroup or None (the group's own ring_group, if any)"
            )
        self.ring_group = ring_group
        self._ring_attn_fn = attn_fn  # ring_attention's: None is its LSE-returning kernels

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        *,
        seq_splits=None,
        head_splits=None,
        layout: str = "bshd",
    ) -> torch.Tensor:
        group = group_for(self.group)
        if self.wire_dtype is not None:  # every call quantized, owned and dequantized
            group = WireCalls(group, self.wire_dtype)
        # Checked here, before q's call: a refusal of k's or v's call once q's is out would
        # leave the borrowed calls' tags waiting for barrier().
        kv_heads = _check_qkv(q, k, v, layout)
        seq_splits = as_splits(seq_splits, "seq_splits")  # once: an iterator is read once
        head_splits = as_splits(head_splits, "head_splits")
        ring = self._ring(group)
        if ring is not None:
            _check_ring_heads(group, q, layout, head_splits)
            return self._grouped(group, q, k, v, kv_heads, seq_splits, head_splits, layout, ring)
        if kv_heads is not None or self.pipeline > 1:
            return self._grouped(group, q, k, v, kv_heads, seq_splits, head_splits, layout)
        kw = dict(seq_splits=seq_splits, head_splits=head_splits, layout=layout)
        qkv = [t.contiguous() for t in (q, k, v)]
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in qkv)
        if needs_grad or torch.compiler.is_compiling():  # barrier() is eager only
            heads = [group.all_to_all_single_4d(t, 0, tag, **kw) for t, tag in zip(qkv, self.tags)]
        else:
            heads = [
                group.all_to_all_single_4d_borrowed(t, 0, tag, barrier=False, **kw)
                for t, tag in zip(qkv, self.tags)
            ]
            group.barrier()
        order = _to_bhsd(layout)  # the plan accepted the layout: it names b, s, h and d
        o = _call_attn(self.attn_fn, *(t.permute(order) for t in heads))
        back = [order.index(i) for i in range(4)]
        o = o.permute(back).contiguous()
        return group.all_to_all_single_4d(o, 1, self.tags[3], **kw)

    def _ring(self, group):
        """The ring group of this call, or None for none (or one of a single rank)."""
        ring = (
            self.ring_group if self.ring_group is not None else getattr(group, "ring_group", None)
        )
        if ring is None or dist.get_world_size(ring) == 1:
            return None
        return ring

    def _grouped(self, group, q, k, v, kv_heads, seq_splits, head_splits, layout, ring=None):
        """Grouped-query k and v, a pipeline or a ring: the calls of every `HeadGroup` in turn,
        each group's input calls issued before the previous group's attention."""
        q, k, v = (t.contiguous() for t in (q, k, v))
        splits = _q_splits(group, q, seq_splits, head_splits, layout)
        h = layout.index("h")  # the plan accepted the layout
        groups = head_groups(splits, kv_heads or sum(splits), self.pipeline)
        one = len(groups) == 1
        owned = (
            not one
            or torch.compiler.is_compiling()
            or (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)))
        )
        tq, tk, tv, to = self.tags

        def send(hg):
            calls = (
                (q_send(q, hg, h), tq, head_splits if one else list(hg.q_splits)),
                (kv_send(k, hg, h), tk, list(hg.kv_splits)),
                (kv_send(v, hg, h), tv, list(hg.kv_splits)),
            )
            if owned:
                return [
                    group.all_to_all_single_4d(
                        x, 0, tag, seq_splits=seq_splits, head_splits=s, layout=layout
                    )
                    for x, tag, s in calls
                ]
            heads = [
                group.all_to_all_single_4d_borrowed(
                    x, 0, tag, seq_splits=seq_splits, head_splits=s, layout=layout, barrier=False
                )
                for x, tag, s in calls
            ]
            group.barrier()  # (calls holds the inputs until here, as barrier=False needs)
            return heads

        order = _to_bhsd(layout)
        back = [order.index(i) for i in range(4)]
        outs, pending = [], send(groups[0])
        for g, hg in enumerate(groups):
            after = send(groups[g + 1]) if g + 1 < len(groups) else None
            heads = (t.permute(order) for t in pending)
            if ring is None:
                o = self._attend(hg, group.rank, *heads)
            else:
                o = self._attend_ring(hg, group.rank, ring, *heads)
            outs.append(
                group.all_to_all_single_4d(
                    o.permute(back).contiguous(),
                    1,
                    to,
                    seq_splits=seq_splits,
                    head_splits=head_splits if one else list(hg.q_splits),
                    layout=layout,
                )
            )
            pending = after
        return outs[0] if one else torch.cat(outs, dim=h)

    def _attend(self, hg, rank, q, k, v):
        """attn_fn on one group's (b, h, s, d) heads, k and v with this rank's kv heads."""
        counts = hg.counts[rank]
        if hg.gqa and counts:
            if hg.uniform and self.attn_fn is F.scaled_dot_product_attention:
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            k, v = expand_kv(k, counts), expand_kv(v, counts)
        return _call_attn(self.attn_fn, q, k, v)

    def _attend_ring(self, hg, rank, ring, q, k, v):
        """ring_attention on one group's heads: k and v keep their fewer heads where every kv
        head of this rank serves equally many q heads, else are expanded to q's."""
        counts = hg.counts[rank]
        if hg.gqa and counts and not (len(set(counts)) == 1 and q.shape[1] % k.shape[1] == 0):
            k, v = expand_kv(k, counts), expand_kv(v, counts)
        return ring_attention(q, k, v, ring, attn_fn=self._ring_attn_fn)


def _check_ring_heads(group, q, layout, head_splits) -> None:
    """With a ring: q's heads, fewer than the Ulysses degree, need head_splits (before any
    call, on every rank alike: every rank sees the same head count)."""
    _check_layout(layout)
    heads = q.shape[layout.index("h")]
    if head_splits is None and heads < group.world_size:
        raise FastUlyssesError(
            f"q has {heads} heads, fewer than the Ulysses degree {group.world_size} (the Ulysses "
            "group's size), and head_splits is None: pass head_splits giving some ranks no "
            f"head (e.g. {[1] * heads + [0] * (group.world_size - heads)}), or use a smaller "
            "Ulysses degree and a larger ring"
        )


def _call_attn(attn_fn, q, k, v):
    """attn_fn(q, k, v), or for a rank of no heads an empty output that autograd still joins to
    q, k and v (so this rank's backward makes every call its peers make; SDPA on zero heads
    dies of SIGFPE on the CPU)."""
    if q.shape[1] == 0:
        return (q.sum() + k.sum()) * 0 + v
    o = attn_fn(q, k, v)
    expected = (*q.shape[:3], v.shape[3])  # SDPA's: q's (b, h, S) and v's head dim
    if isinstance(o, torch.Tensor) and o.shape == expected:
        return o
    got = f"a tensor of shape {tuple(o.shape)}" if isinstance(o, torch.Tensor) else repr(o)
    if len(got) > 80:  # (a long tuple or list: its type says enough)
        got = f"a {type(o).__name__}"
    raise FastUlyssesError(
        f"attn_fn returned {got} for q of shape {tuple(q.shape)}: it must return a tensor "
        f"of shape (b, h, S, d_v) = {expected} (q's b, h and S, v's head dim), as "
        "scaled_dot_product_attention does"
    )


def _check_qkv(q, k, v, layout) -> int | None:
    """Checks q, k and v together, before any call: each a 4-d torch.Tensor, all of q's dtype
    and on q's device, k and v of one shape, q's or q's with fewer heads. The group's tensor
    rules then refuse k's or v's call only where they refuse q's, the first, so nothing goes out
    before a refusal (one between the borrowed calls would leave their tags waiting for
    `barrier()`).

    Returns:
        None where q, k and v have one shape; else k's head count.

    Raises:
        FastUlyssesError naming the tensor and the rule.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise FastUlyssesError(f"{name} is a {type(t).__name__}: it must be a torch.Tensor")
        if t.dim() != 4:
            raise FastUlyssesError(
                f"{name} has shape {tuple(t.shape)}: q, k and v must be 4-d tensors"
            )
        if t.dtype != q.dtype:
            raise FastUlyssesError(
                f"{name} has dtype {t.dtype} but q has {q.dtype}: q, k and v must have one dtype"
            )
        if t.device != q.device:
            raise FastUlyssesError(
                f"{name} is on {t.device} but q is on {q.device}: q, k and v must be on one device"
            )
    if k.shape == q.shape and v.shape == q.shape:
        return None
    _check_layout(layout)
    h = layout.index("h")
    others = [n for i, n in enumerate(q.shape) if i != h]
    if [n for i, n in enumerate(k.shape) if i != h] != others:
        raise FastUlyssesError(
            f"k has shape {tuple(k.shape)} but q has {tuple(q.shape)}: k "
            f"and v must have q's shape, or q's with fewer heads (dimension "
            f"{h} in {layout}) for grouped-query attention"
        )
    if v.shape != k.shape:
        raise FastUlyssesError(
            f"v has shape {tuple(v.shape)} but k has {tuple(k.shape)}: k and v must have one shape"
        )
    hq, hkv = q.shape[h], k.shape[h]
    if hkv == 0 or hq % hkv:
        raise FastUlyssesError(
            f"k has {hkv} heads but q has {hq}: q's head count must be a "
            "multiple of k's and v's (grouped-query attention)"
        )
    return hkv


def _check_layout(layout) -> None:
    if layout not in LAYOUTS:
        plan(1, 0, 0, (1, 1, 1, 1), 1, layout=layout)  # the plan's message for the layout


@torch.compiler.disable  # host-side planning, as validation.plan_call
def _q_splits(group, q, seq_splits, head_splits, layout) -> tuple:
    """q's head splits resolved by the plan of q's call (its message for a call it refuses)."""
    try:
        _check_layout(layout)
        seq = as_splits(seq_splits, "seq_splits")
        heads = as_splits(head_splits, "head_splits")
        return _resolved_heads(
            group.world_size,
            group.rank,
            tuple(q.shape),
            q.element_size(),
            None if seq is None else tuple(seq),
            None if heads is None else tuple(heads),
            layout,
        )
    except ValueError as error:
        raise refused(error) from None


def _resolved_heads(world_size, rank, shape, element_size, seq, heads, layout) -> tuple:
    return tuple(
        cached_plan(world_size, rank, 0, shape, element_size, seq, heads, layout).head_splits
    )
