"""One rank of the UlyssesAttention test (tests/python/test_attention.py on gloo CPU ranks; with
--shared-gpu, tests/gpu/test_autograd_gpu.py runs it on the fast group).

For P = 1..world_size (the last P ranks), with the module built from the subgroup's
ProcessGroup (the registry's group) and both layouts, even and uneven splits (heads that P does
not divide, a sequence it does not divide):
- attention_P<p>: forward and q/k/v gradients match single-process SDPA over the whole
  sequence and every head (float32 tolerances), and the inference path (borrowed q, k, v and one
  barrier, under no_grad) gives the training path's output (same tolerances);
- gqa_P<p>: k and v with fewer heads than q (Hkv a multiple of P, multi-query Hkv = 1, fewer kv
  heads than ranks, uneven q heads and sequence; both layouts; the default SDPA and a custom
  attn_fn): forward and q/k/v gradients match single-process SDPA(enable_gqa=True), the
  inference path gives the training path's output, and each rank's k and v calls receive
  exactly the kv heads its q heads use (send: no head twice where Hkv % P == 0, and then k
  itself, uncopied);
- pipeline_P<p>: UlyssesAttention(pipeline=G) against pipeline=1 (even, uneven, GQA, MQA; both
  layouts): output and q/k/v gradients bit-equal on the CPU for q, k, v of one shape (each head
  is attended to independently, with the same kernel, in both; a kv head's gradient summed
  over q heads in other groups is added in another order, so GQA cases compare within float32
  tolerance, as every case does on a GPU), the inference path too; G groups of calls, group
  g + 1's q, k and v issued before group g's output; pipeline=1 makes today's calls; on the
  fast group at P > 1 every pipelined input call's result is an AsyncCollectiveTensor (issued,
  not waited for: no timing is asserted);
- refusals_P<p>: a forward every rank refuses (attn_fn returning half the sequence on the
  plain, grouped-query and pipelined paths; v of another dtype than q's) raises
  FastUlyssesError on every rank, and the next forward on the same group matches SDPA; splits
  given as one-shot iterators give the list's result;
- registry_P<p>: group_for(pg) builds one group per ProcessGroup and returns it again.
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from multirank import run_on_subgroups, subgroup_sizes

import fast_ulysses as fu
from fast_ulysses.attention import group_for

D = 8


def split_cases(P):
    if P == 1:
        return [("even", None, None)]
    return [("even", None, None), ("uneven", [3, 2, 0][:P] if P == 3 else [3, 2], [2, 1, 2][:P])]


def full_inputs(P, seq, heads, layout, seed, device):
    S = sum(seq) if seq else 2 * P
    N = sum(heads) if heads else 2 * P
    g = torch.Generator().manual_seed(seed)
    full = [torch.randn(2, S, N, D, generator=g) for _ in range(4)]  # q, k, v, output weight
    if layout == "sbhd":
        full = [t.transpose(0, 1).contiguous() for t in full]
    return [t.to(device) for t in full], S


def check_attention(pg, P, device) -> int:
    rank = dist.get_rank(pg)
    module = fu.UlyssesAttention(pg)
    count = 0
    for (name, seq, heads), layout in itertools.product(split_cases(P), ("bshd", "sbhd")):
        (q, k, v, w), S = full_inputs(P, seq, heads, layout, 100 * P + count, device)
        rows = seq or [S // P] * P
        start, n = sum(rows[:rank]), rows[rank]
        s_dim = layout.index("s")
        # The reference: one process, every head, the whole sequence.
        qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
        to_bhsd = (0, 2, 1, 3) if layout == "bshd" else (1, 2, 0, 3)
        back = [to_bhsd.index(i) for i in range(4)]
        of = F.scaled_dot_product_attention(*(t.permute(to_bhsd) for t in (qf, kf, vf)))
        of = of.permute(back)
        (of * w).sum().backward()
        # This rank's shards.
        ql, kl, vl = (t.narrow(s_dim, start, n).contiguous().requires_grad_() for t in (q, k, v))
        kw = dict(seq_splits=seq, head_splits=heads, layout=layout)
        out = module(ql, kl, vl, **kw)
        want = of.detach().narrow(s_dim, start, n)
        torch.testing.assert_close(out.detach(), want, msg=lambda m: f"{name} {layout}: {m}")
        (out * w.narrow(s_dim, start, n)).sum().backward()
        for label, local, ref in (("q", ql, qf), ("k", kl, kf), ("v", vl, vf)):
            torch.testing.assert_close(
                local.grad,
                ref.grad.narrow(s_dim, start, n),
                msg=lambda m: f"{name} {layout} {label}.grad: {m}",
            )
        with torch.no_grad():
            infer = module(ql, kl, vl, **kw)
        # SDPA may pick another kernel without grad (on a GPU): close, not bit-exact.
        torch.testing.assert_close(
            infer, out.detach(), msg=lambda m: f"{name} {layout} inference path: {m}"
        )
        count += 1
    return count


class Recording:
    """A group that records every call it passes on to `inner`: (entry, mode, tag, input shape,
    head_splits, result shape, barrier, input data_ptr, result type name)."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.rank, self.world_size = inner.rank, inner.world_size
        self.fallback, self.fallback_reason = inner.fallback, inner.fallback_reason

    def _record(self, entry, x, mode, tag, kw, out, barrier=None):
        self.calls.append(
            dict(
                entry=entry,
                mode=mode,
                tag=tag,
                shape=tuple(x.shape),
                head_splits=kw.get("head_splits"),
                out=tuple(out.shape),
                barrier=barrier,
                ptr=x.data_ptr(),
                type=type(out).__name__,
            )
        )
        return out

    def all_to_all_single_4d(self, x, mode, tag=None, **kw):
        return self._record(
            "owned", x, mode, tag, kw, self.inner.all_to_all_single_4d(x, mode, tag, **kw)
        )

    def all_to_all_single_4d_borrowed(self, x, mode, tag, *, barrier=True, **kw):
        return self._record(
            "borrowed",
            x,
            mode,
            tag,
            kw,
            self.inner.all_to_all_single_4d_borrowed(x, mode, tag, barrier=barrier, **kw),
            barrier,
        )

    def barrier(self):
        self.calls.append(dict(entry="barrier"))
        self.inner.barrier()

    def reserve(self, calls):
        self.inner.reserve(calls)

    def stats(self):
        return self.inner.stats()

    def destroy(self):
        self.inner.destroy()


def gqa_cases(P):
    """(name, Hq, Hkv, seq_splits, head_splits): Hkv % P == 0, multi-query, fewer kv heads than
    ranks, uneven q heads (kv heads shared by two ranks, a rank of no q heads) and rows."""
    cases = [("kv_multiple_of_P", 4 * P, 2 * P, None, None), ("mqa", 2 * P, 1, None, None)]
    if P >= 3:
        cases.append(("fewer_kv_than_ranks", 2 * P, 2, None, None))
    uneven = {
        2: (6, 3, [3, 2], [3, 3]),
        3: (6, 3, [2, 0, 3], [3, 2, 1]),
        4: (8, 2, [3, 2, 0, 2], [3, 2, 2, 1]),
    }
    if P in uneven:
        hq, hkv, seq, heads = uneven[P]
        cases.append(("uneven", hq, hkv, seq, heads))
        cases.append(("uneven_mqa_empty_rank", 5, 1, seq, [3, 2, 0, 0][:P] if P > 2 else [5, 0]))
    return cases


def gqa_inputs(P, hq, hkv, seq, layout, seed, device):
    S = sum(seq) if seq else 2 * P
    g = torch.Generator().manual_seed(seed)
    full = [torch.randn(2, S, n, D, generator=g) for n in (hq, hkv, hkv, hq)]  # q, k, v, weight
    if layout == "sbhd":
        full = [t.transpose(0, 1).contiguous() for t in full]
    return [t.to(device) for t in full], S


def my_kv_heads(rank, hq, hkv, heads, P):
    """The kv heads rank `rank`'s q heads use, from the call alone."""
    splits = heads or [hq // P] * P
    start = sum(splits[:rank])
    return sorted({i // (hq // hkv) for i in range(start, start + splits[rank])})


def sdpa(q, k, v):  # a custom attn_fn: gets k and v with q's head count
    assert q.shape[1] == k.shape[1] == v.shape[1], "a custom attn_fn got fewer kv heads"
    return F.scaled_dot_product_attention(q, k, v)


def check_gqa(pg, P, device) -> int:
    rank = dist.get_rank(pg)
    count = 0
    for (name, hq, hkv, seq, heads), layout, fn in itertools.product(
        gqa_cases(P), ("bshd", "sbhd"), (None, sdpa)
    ):
        where = f"{name} {layout} attn_fn={'custom' if fn else 'default'}"
        (q, k, v, w), S = gqa_inputs(P, hq, hkv, seq, layout, 300 * P + count, device)
        rows = seq or [S // P] * P
        start, n = sum(rows[:rank]), rows[rank]
        s_dim, h_dim = layout.index("s"), layout.index("h")
        qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
        to_bhsd = (0, 2, 1, 3) if layout == "bshd" else (1, 2, 0, 3)
        back = [to_bhsd.index(i) for i in range(4)]
        of = F.scaled_dot_product_attention(
            *(t.permute(to_bhsd) for t in (qf, kf, vf)), enable_gqa=True
        ).permute(back)
        (of * w).sum().backward()
        ql, kl, vl = (t.narrow(s_dim, start, n).contiguous().requires_grad_() for t in (q, k, v))
        group = Recording(group_for(pg))
        module = fu.UlyssesAttention(group, attn_fn=fn)
        kw = dict(seq_splits=seq, head_splits=heads, layout=layout)
        out = module(ql, kl, vl, **kw)
        torch.testing.assert_close(
            out.detach(), of.detach().narrow(s_dim, start, n), msg=lambda m: f"{where}: {m}"
        )
        (out * w.narrow(s_dim, start, n)).sum().backward()
        for label, local, ref in (("q", ql, qf), ("k", kl, kf), ("v", vl, vf)):
            torch.testing.assert_close(
                local.grad,
                ref.grad.narrow(s_dim, start, n),
                msg=lambda m: f"{where} {label}.grad: {m}",
            )
        for call in (c for c in group.calls if c.get("tag") in ("fu.attn.k", "fu.attn.v")):
            want = my_kv_heads(rank, hq, hkv, heads, P)
            assert call["out"][h_dim] == len(want), (
                f"{where}: {call['tag']} received {call['out'][h_dim]} kv heads, not {want}"
            )
            sent = sum(len(my_kv_heads(r, hq, hkv, heads, P)) for r in range(P))
            assert call["shape"][h_dim] == sent, (
                f"{where}: {call['tag']} sent {call['shape'][h_dim]} kv heads, not {sent}"
            )
            if hkv % P == 0 and heads is None:
                assert (
                    sent == hkv
                    and call["ptr"] == (kl if call["tag"] == "fu.attn.k" else vl).data_ptr()
                ), f"{where}: {call['tag']}'s send tensor is not k or v itself"
        with torch.no_grad():
            infer = module(ql, kl, vl, **kw)
        torch.testing.assert_close(
            infer, out.detach(), msg=lambda m: f"{where} inference path: {m}"
        )
        count += 1
    return count


def pipeline_cases(P):
    """(name, Hq, Hkv, seq_splits, head_splits, G values)."""
    uneven = {1: ([5], [5]), 2: ([3, 2], [3, 1]), 3: ([3, 2, 0], [3, 2, 0])}
    seq, heads = uneven[P]
    return [
        ("even", 3 * P, 3 * P, None, None, (2, 3)),
        ("uneven", sum(heads), sum(heads), seq, heads, (2, 3)),
        ("gqa", 4 * P, 2 * P, None, None, (2, 4)),
        ("mqa_uneven", sum(heads), 1, seq, heads, (2, 3)),
    ]


def check_pipeline(pg, P, device) -> int:
    rank = dist.get_rank(pg)
    exact = device.type == "cpu"
    count = 0
    for (name, hq, hkv, seq, heads, gs), layout in itertools.product(
        pipeline_cases(P), ("bshd", "sbhd")
    ):
        (q, k, v, w), S = gqa_inputs(P, hq, hkv, seq, layout, 500 * P + count, device)
        rows = seq or [S // P] * P
        s_dim = layout.index("s")
        ql, kl, vl, wl = (
            t.narrow(s_dim, sum(rows[:rank]), rows[rank]).contiguous() for t in (q, k, v, w)
        )
        kw = dict(seq_splits=seq, head_splits=heads, layout=layout)
        plain = fu.UlyssesAttention(pg)
        want, want_grads = _run(plain, ql, kl, vl, wl, kw)
        with torch.no_grad():
            want_infer = plain(ql, kl, vl, **kw)
        for G in gs:
            where = f"{name} {layout} pipeline={G}"
            group = Recording(group_for(pg))
            got, got_grads = _run(fu.UlyssesAttention(group, pipeline=G), ql, kl, vl, wl, kw)
            bitwise = exact and hkv == hq
            for label, a, b in (
                ("output", got, want),
                *zip(("q.grad", "k.grad", "v.grad"), got_grads, want_grads),
            ):
                _same(a, b, bitwise, f"{where}: {label} against pipeline=1's")
            _check_pipelined_calls(group.calls, G, where, P, group.fallback)
            with torch.no_grad():
                infer = fu.UlyssesAttention(pg, pipeline=G)(ql, kl, vl, **kw)
            _same(infer, want_infer, bitwise, f"{where}: the inference path")
            count += 1
    _check_unpipelined_calls(pg, P, device)
    return count


def _same(a, b, bitwise, where):
    if bitwise:
        assert torch.equal(a, b), (
            f"{where}: not bit-equal (largest difference "
            f"{(a - b).abs().max().item() if a.numel() else 0})"
        )
    else:
        torch.testing.assert_close(a, b, msg=lambda m: f"{where}: {m}")


def _run(module, q, k, v, w, kw):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out = module(q, k, v, **kw)
    (out * w).sum().backward()
    return out.detach(), [t.grad for t in (q, k, v)]


def _check_pipelined_calls(calls, G, where, P, fallback):
    """G groups of owned calls: q, k, v of group 0, then per group g: q, k, v of g + 1 (issued
    before g's output), g's output; on the fast group at P > 1, input results in flight."""
    tags = [c["tag"] for c in calls]
    want = ["fu.attn.q", "fu.attn.k", "fu.attn.v"]
    for g in range(G):
        want += (["fu.attn.q", "fu.attn.k", "fu.attn.v"] if g + 1 < G else []) + ["fu.attn.o"]
    assert tags == want, f"{where}: calls {tags}, expected {want}"
    assert all(c["entry"] == "owned" for c in calls), f"{where}: a pipelined call not owned"
    if not fallback and P > 1:
        kinds = {c["type"] for c in calls if c["mode"] == 0}
        assert kinds == {"AsyncCollectiveTensor"}, (
            f"{where}: input results {kinds}, not AsyncCollectiveTensor (in flight)"
        )


def _check_unpipelined_calls(pg, P, device):
    """pipeline=1 with q, k, v of one shape makes today's calls: without grad, three borrowed
    calls with barrier=False and the user's head_splits, one barrier(), the owned output."""
    group = Recording(group_for(pg))
    heads = [3, 2, 0][:P] if P > 1 else None
    q = torch.randn(1, 2, sum(heads) if heads else 2 * P, D, device=device)
    with torch.no_grad():
        fu.UlyssesAttention(group, pipeline=1)(q, q, q, head_splits=heads)
    got = [(c["entry"], c.get("tag"), c.get("barrier"), c.get("head_splits")) for c in group.calls]
    want = [("borrowed", f"fu.attn.{t}", False, heads) for t in "qkv"] + [
        ("barrier", None, None, None),
        ("owned", "fu.attn.o", None, heads),
    ]
    assert got == want, f"pipeline=1 calls {got}, expected today's {want}"


def check_refusals(pg, P, device) -> int:
    rank = dist.get_rank(pg)
    (q, k, v, _), S = full_inputs(P, None, None, "bshd", 700 + P, device)
    n = S // P
    ql, kl, vl = (t.narrow(1, rank * n, n).contiguous() for t in (q, k, v))
    want = F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)))
    want = want.transpose(1, 2).narrow(1, rank * n, n)

    def half(q, k, v):  # half the sequence: the output's call would take it silently
        return F.scaled_dot_product_attention(q, k, v)[:, :, : q.shape[2] // 2]

    kv = [t[:, :, :P].contiguous() for t in (kl, vl)]  # grouped-query: 1 kv head per rank
    heads = 2  # per rank (2 * P in all); the pipelined module's groups have 1 each
    cases = [
        ("plain attn_fn", fu.UlyssesAttention(pg, attn_fn=half), (ql, kl, vl), heads),
        ("grouped-query attn_fn", fu.UlyssesAttention(pg, attn_fn=half), (ql, *kv), heads),
        ("pipelined attn_fn", fu.UlyssesAttention(pg, attn_fn=half, pipeline=2), (ql, kl, vl), 1),
        ("v float64", fu.UlyssesAttention(pg), (ql, kl, vl.double()), None),
    ]
    for name, module, args, h in cases:
        if h is None:
            message = "v has dtype torch.float64 but q has torch.float32: q, k and v must have"
        else:
            message = (
                f"attn_fn returned a tensor of shape (2, {h}, {S // 2}, {D}) for q of shape "
                f"(2, {h}, {S}, {D}): it must return a tensor of shape (b, h, S, d_v)"
            )
        try:
            with torch.no_grad():  # the borrowed calls of q, k and v
                module(*args)
        except fu.FastUlyssesError as error:
            assert message in str(error), f"{name}: refused with {error}, not {message!r}"
        else:
            raise AssertionError(f"{name}: not refused")
        with torch.no_grad():
            after = fu.UlyssesAttention(pg)(ql, kl, vl)
        torch.testing.assert_close(after, want, msg=lambda m, name=name: f"after {name}: {m}")
    with torch.no_grad():
        once = fu.UlyssesAttention(pg)(
            ql, kl, vl, seq_splits=iter([n] * P), head_splits=iter([2] * P)
        )
    torch.testing.assert_close(once, want, msg=lambda m: f"one-shot split iterators: {m}")
    return len(cases) + 1


def check_registry(pg, P, device) -> None:
    group = group_for(pg)
    assert group is group_for(pg), "the registry built a second group for one ProcessGroup"
    assert group.world_size == P and fu.UlyssesAttention(group).group is group


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--shared-gpu",
        action="store_true",
        help="every rank on cuda:0 (make_group picks the fast group)",
    )
    args = parser.parse_args()

    def body(report, pg, P, device):
        with report.check(f"attention_P{P}") as entry:
            entry["detail"] = f"{check_attention(pg, P, device)} cases"
        with report.check(f"gqa_P{P}") as entry:
            entry["detail"] = f"{check_gqa(pg, P, device)} cases"
        with report.check(f"pipeline_P{P}") as entry:
            entry["detail"] = f"{check_pipeline(pg, P, device)} cases"
        with report.check(f"refusals_P{P}") as entry:
            entry["detail"] = f"{check_refusals(pg, P, device)} cases"
        with report.check(f"registry_P{P}"):
            check_registry(pg, P, device)
        group_for(pg).destroy()

    return run_on_subgroups(args.shared_gpu, body)


def check_names(world: int, shared_gpu: bool = False) -> list[str]:
    return [
        f"{c}_P{P}"
        for P in subgroup_sizes(world, shared_gpu)
        for c in ("attention", "gqa", "pipeline", "refusals", "registry")
    ]


if __name__ == "__main__":
    sys.exit(main())
