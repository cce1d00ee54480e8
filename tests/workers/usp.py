"""One rank of the Ulysses x Ring ("USP") test (tests/python/test_usp.py on gloo CPU ranks; with
--shared-gpu, tests/gpu/test_usp_gpu.py runs it on ranks sharing the first GPU).

The world of P = R * U ranks is cut, for each (R, U) in `LAYOUTS[P]` (or `--layout RxU`
alone), with dist.new_group into R Ulysses groups of U contiguous ranks and U rings of the ranks
at one Ulysses position (rank i * U + u is Ulysses rank u of group i and ring rank i of ring u).
The sequence is R ring blocks in order, block i held by Ulysses group i, each member its
seq_splits rows. Checks, each named `<check>_R<R>xU<U>`:
- usp: UlyssesAttention(ulysses_pg, ring_group=ring_pg): forward and q/k/v gradients equal
  single-process SDPA over the whole sequence and every head (float32 tolerances), and the
  inference path (no grad) gives the same output, for: even splits (bshd and sbhd), uneven heads
  (head_splits), uneven sequence shards (ring blocks of different lengths, a rank of no rows),
  grouped-query k/v (kv heads shared evenly, multi-query, and unevenly: expanded per rank),
  pipeline=2 (with GQA too), and a user attn_fn returning (out, lse) (explicit math);
- ring_direct: fast_ulysses.ring_attention on the ring group alone: q and k/v blocks of different
  lengths per ring rank, grouped-query heads, v's head dim unlike q's, an explicit scale; against
  single-process attention over every ring rank's blocks;
- refusals: every rank raises FastUlyssesError naming the rule for q heads below the Ulysses
  degree without head_splits, an attn_fn returning only a tensor, an attn_fn whose lse is not
  differentiable (at backward), and ring ranks holding different heads; a forward after them
  still matches SDPA, and so does one whose ring is the group's own `ring_group` attribute.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import traceback

import torch
import torch.distributed as dist
import torch.nn.functional as F
from multirank import Report

import fast_ulysses as fu
from fast_ulysses.attention import group_for

D = 8
LAYOUTS = {4: [(2, 2)], 6: [(2, 3)], 8: [(4, 2), (2, 4)]}  # (ring R, Ulysses U) per world size


def math_attn(q, k, v):
    """A user attn_fn returning (out, lse): explicit float32 math."""
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * q.shape[-1] ** -0.5
    lse = torch.logsumexp(s, dim=-1)
    return torch.matmul(torch.softmax(s, dim=-1), v.float()).to(q.dtype), lse


def cases(R, U):
    """(name, Hq, Hkv, seq_splits of each ring block or None, head_splits, pipeline, attn_fn,
    layout)."""
    uneven_seq = [[(3 * i + 2 * u) % 4 for u in range(U)] for i in range(R)]
    uneven_heads = [3] + [2] * (U - 1)
    gqa_uneven = ([3, 3], [3, 2, 1], [3, 2, 1, 0])[U - 2]  # 6 q heads, 3 kv heads
    return [
        ("even", 2 * U, 2 * U, None, None, 1, None, "bshd"),
        ("even_sbhd", 2 * U, 2 * U, None, None, 1, None, "sbhd"),
        ("uneven_heads", 2 * U + 1, 2 * U + 1, None, uneven_heads, 1, None, "bshd"),
        ("uneven_seq", 2 * U, 2 * U, uneven_seq, None, 1, None, "bshd"),
        ("gqa", 4 * U, U, None, None, 1, None, "bshd"),
        ("mqa_uneven_seq", 2 * U, 1, uneven_seq, None, 1, None, "bshd"),
        ("gqa_uneven_heads", 6, 3, None, gqa_uneven, 1, None, "bshd"),
        ("pipeline2", 2 * U, 2 * U, uneven_seq, None, 2, None, "bshd"),
        ("pipeline2_gqa", 4 * U, 2 * U, None, None, 2, None, "sbhd"),
        ("attn_fn_lse", 2 * U + 1, 2 * U + 1, uneven_seq, uneven_heads, 1, math_attn, "bshd"),
    ]


def block_rows(R, U, seq):
    """rows[i][u]: the rows Ulysses rank u of ring block i holds."""
    return seq or [[2] * U for _ in range(R)]


def check_usp(upg, rpg, R, U, device) -> int:
    i, u = dist.get_rank(rpg), dist.get_rank(upg)
    count = 0
    for name, hq, hkv, seq, heads, G, fn, layout in cases(R, U):
        where = f"{name} (R={R}, U={U})"
        rows = block_rows(R, U, seq)
        S = sum(map(sum, rows))
        start, n = sum(map(sum, rows[:i])) + sum(rows[i][:u]), rows[i][u]
        g = torch.Generator().manual_seed(1000 * R + 10 * U + count)
        q, k, v, w = (torch.randn(2, S, h, D, generator=g) for h in (hq, hkv, hkv, hq))
        to_bhsd = (0, 2, 1, 3)
        if layout == "sbhd":
            q, k, v, w = (t.transpose(0, 1).contiguous() for t in (q, k, v, w))
            to_bhsd = (1, 2, 0, 3)
        q, k, v, w = (t.to(device) for t in (q, k, v, w))
        s_dim = layout.index("s")
        back = [to_bhsd.index(j) for j in range(4)]
        qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
        of = F.scaled_dot_product_attention(
            *(t.permute(to_bhsd) for t in (qf, kf, vf)), enable_gqa=hkv != hq
        ).permute(back)
        (of * w).sum().backward()
        ql, kl, vl = (t.narrow(s_dim, start, n).contiguous().requires_grad_() for t in (q, k, v))
        module = fu.UlyssesAttention(upg, attn_fn=fn, pipeline=G, ring_group=rpg)
        kw = dict(seq_splits=seq and seq[i], head_splits=heads, layout=layout)
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
        with torch.no_grad():
            infer = module(ql, kl, vl, **kw)
        torch.testing.assert_close(infer, out.detach(), msg=lambda m: f"{where} no grad: {m}")
        count += 1
    return count


def check_ring_direct(rpg, R, device) -> int:
    """ring_attention alone: ring rank i holds q rows q_len[i] and k/v rows kv_len[i]."""
    i = dist.get_rank(rpg)
    q_len = [(2 * j + 1) % 5 for j in range(R)]  # 1, 3, 0, 2: one rank of no q rows at R = 4
    kv_len = [(j + 2) % 4 for j in range(R)]  # 2, 3, 0, 1
    g = torch.Generator().manual_seed(77 + R)
    q = torch.randn(2, 4, sum(q_len), D, generator=g).to(device)
    k = torch.randn(2, 2, sum(kv_len), D, generator=g).to(device)
    v = torch.randn(2, 2, sum(kv_len), 2 * D, generator=g).to(device)  # d_v = 2 * d
    w = torch.randn(2, 4, sum(q_len), 2 * D, generator=g).to(device)
    scale = 0.3
    qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
    of = F.scaled_dot_product_attention(qf, kf, vf, scale=scale, enable_gqa=True)
    (of * w).sum().backward()
    qs, ks = sum(q_len[:i]), sum(kv_len[:i])
    ql = q.narrow(2, qs, q_len[i]).clone().requires_grad_()
    kl, vl = (t.narrow(2, ks, kv_len[i]).clone().requires_grad_() for t in (k, v))
    out = fu.ring_attention(ql, kl, vl, rpg, scale=scale)
    torch.testing.assert_close(out.detach(), of.detach().narrow(2, qs, q_len[i]))
    (out * w.narrow(2, qs, q_len[i])).sum().backward()
    for label, local, ref, s, n in (
        ("q", ql, qf, qs, q_len[i]),
        ("k", kl, kf, ks, kv_len[i]),
        ("v", vl, vf, ks, kv_len[i]),
    ):
        torch.testing.assert_close(
            local.grad, ref.grad.narrow(2, s, n), msg=lambda m, label=label: f"{label}.grad: {m}"
        )
    return 1


def _refused(what, message, call):
    try:
        call()
    except fu.FastUlyssesError as error:
        assert message in str(error), f"{what}: refused with {error}, not {message!r}"
    else:
        raise AssertionError(f"{what}: not refused")


def check_refusals(upg, rpg, R, U, device) -> int:
    i, u = dist.get_rank(rpg), dist.get_rank(upg)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 2, 2 * U, D, generator=g).to(device)  # this rank's 2 rows, 2U heads
    few = q[:, :, : U - 1].contiguous()
    _refused(
        "heads below the Ulysses degree",
        f"q has {U - 1} heads, fewer than the Ulysses degree {U}",
        lambda: fu.UlyssesAttention(upg, ring_group=rpg)(few, few, few),
    )

    def plain(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    _refused(
        "attn_fn returning a tensor",
        "with a ring group it must return (out, lse)",
        lambda: fu.UlyssesAttention(upg, attn_fn=plain, ring_group=rpg)(q, q, q),
    )

    def detached(q, k, v):
        out, lse = math_attn(q, k, v)
        return out, lse.detach()

    qg = q.clone().requires_grad_()
    _refused(
        "lse not differentiable (checked at forward when gradients are to come)",
        "lse does not require grad",
        lambda: fu.UlyssesAttention(upg, attn_fn=detached, ring_group=rpg)(qg, qg, qg),
    )
    # A refusal on ring ranks that attend while ring rank 0 has no block to attend: every
    # ring rank raises, none waits in the rotation.
    kv = torch.randn(1, 2, 0 if i == 0 else 4, D, generator=g).to(device)
    _refused(
        "attn_fn refused where ring rank 0 has an empty block",
        "refused what attn_fn returned" if i == 0 else "with a ring group it must return",
        lambda: fu.ring_attention(q[:1, :2], kv, kv, rpg, attn_fn=lambda q, k, v: q),
    )
    heads = [U + 1] + [1] * (U - 1) if i == 0 else [2] * U  # ring block 0 splits heads unlike 1
    _refused(
        "ring ranks holding different heads",
        "every rank of a ring must hold the same batch, heads",
        lambda: fu.UlyssesAttention(upg, ring_group=rpg)(q, q, q, head_splits=heads),
    )
    # The same groups still work.
    full = [torch.empty_like(q) for _ in range(R * U)]
    dist.all_gather(full, q)  # (CPU or a shared GPU: gloo)
    whole = torch.cat(full, dim=1)
    want = F.scaled_dot_product_attention(*(whole.transpose(1, 2),) * 3).transpose(1, 2)
    rank = i * U + u
    got = fu.UlyssesAttention(upg, ring_group=rpg)(q, q, q)
    torch.testing.assert_close(got, want.narrow(1, 2 * rank, 2), msg=lambda m: f"after: {m}")
    # ring_group=None: the group's own ring_group (what make_group sets on a mesh or a pair).
    group = fu.TorchUlyssesGroup(upg)
    group.ring_group = rpg
    got = fu.UlyssesAttention(group)(q, q, q)
    torch.testing.assert_close(got, want.narrow(1, 2 * rank, 2), msg=lambda m: f"group's: {m}")
    return 5


def layouts(world, layout=None):
    """The (R, U) layouts of a launch of `world` ranks: `layout` ("RxU") alone, or LAYOUTS'."""
    if layout:
        R, U = (int(n) for n in layout.split("x"))
        assert R * U == world, f"--layout {layout}: R * U must be the world size {world}"
        return [(R, U)]
    return LAYOUTS.get(world, [])


def check_names(world: int, layout: str | None = None) -> list[str]:
    return [
        f"{c}_R{R}xU{U}"
        for R, U in layouts(world, layout)
        for c in ("usp", "ring_direct", "refusals")
    ]


def build_groups(world, R, U, timeout):
    """(this rank's Ulysses group, its ring group): every rank creates every group, in order."""
    rank = dist.get_rank()
    ulysses = [dist.new_group(list(range(i * U, (i + 1) * U)), timeout=timeout) for i in range(R)]
    rings = [dist.new_group(list(range(u, world, U)), timeout=timeout) for u in range(U)]
    return ulysses[rank // U], rings[rank % U]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared-gpu", action="store_true", help="every rank on cuda:0 (gloo)")
    parser.add_argument("--layout", help="RxU: this layout only (default: LAYOUTS[world])")
    args = parser.parse_args()
    timeout = datetime.timedelta(seconds=120)
    dist.init_process_group("gloo", timeout=timeout)
    if args.shared_gpu:
        torch.cuda.set_device(0)
    device = torch.device("cuda", 0) if args.shared_gpu else torch.device("cpu")
    rank, world = dist.get_rank(), dist.get_world_size()
    report = Report(rank)
    try:
        for R, U in layouts(world, args.layout):
            upg, rpg = build_groups(world, R, U, timeout)
            with report.check(f"usp_R{R}xU{U}") as entry:
                entry["detail"] = f"{check_usp(upg, rpg, R, U, device)} cases"
            with report.check(f"ring_direct_R{R}xU{U}"):
                check_ring_direct(rpg, R, device)
            with report.check(f"refusals_R{R}xU{U}") as entry:
                entry["detail"] = f"{check_refusals(upg, rpg, R, U, device)} cases"
            group_for(upg).destroy()
            dist.barrier()
    except Exception:  # noqa: BLE001 - report everything, then fail this rank
        traceback.print_exc()
        sys.stdout.flush()
        return 1
    report.finish()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
