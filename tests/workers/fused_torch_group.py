"""One rank of test_fused.py: `qk_norm_rope_all_to_all` on TorchUlyssesGroup over gloo CPU ranks,
bit for bit against `norm_rope_reference` of every rank's input followed by `simulate`."""

from __future__ import annotations

import itertools
import sys

import torch
import torch.distributed as dist
from multirank import Report

import fast_ulysses as fu
from fast_ulysses.fused import NORMS, ROPE_STYLES, norm_rope_reference

D = 8


def rank_inputs(P, layout, norm, dtype, seed):
    seq, heads = [3, 1, 4][:P], [2, 0, 3][:P]
    N = sum(heads)
    g = torch.Generator().manual_seed(seed)
    xs = [
        (torch.randn((2, s, N, D) if layout == "bshd" else (s, 2, N, D), generator=g) * 3).to(dtype)
        for s in seq
    ]
    w = torch.rand(N * D if norm == "all_heads" else D, generator=g) + 0.5
    angles = [torch.rand(s, D // 2, generator=g) * 6.28 for s in seq]
    return xs, w, angles, seq, heads


def want(xs, w, angles, norm, style, layout, seq, heads, rank):
    ys = [
        norm_rope_reference(
            x, w, 1e-6, a.cos(), a.sin(), norm=norm, rope_style=style, layout=layout
        )
        for x, a in zip(xs, angles)
    ]
    return fu.simulate(ys, 0, seq_splits=seq, head_splits=heads, layout=layout)[rank]


def main() -> int:
    dist.init_process_group("gloo")
    rank, P = dist.get_rank(), dist.get_world_size()
    report = Report(rank)
    group = fu.TorchUlyssesGroup()
    with report.check("matches_reference") as entry:
        n = 0
        for norm, style, layout, dtype, borrowed in itertools.product(
            NORMS, ROPE_STYLES, ("bshd", "sbhd"), (torch.bfloat16, torch.float32), (False, True)
        ):
            xs, w, angles, seq, heads = rank_inputs(P, layout, norm, dtype, seed=n)
            a = angles[rank]
            got = fu.qk_norm_rope_all_to_all(
                group,
                xs[rank],
                "t",
                norm_weight=w,
                eps=1e-6,
                cos=a.cos(),
                sin=a.sin(),
                norm=norm,
                rope_style=style,
                seq_splits=seq,
                head_splits=heads,
                layout=layout,
                borrowed=borrowed,
            )
            expected = want(xs, w, angles, norm, style, layout, seq, heads, rank)
            assert torch.equal(got, expected), f"{norm} {style} {layout} {dtype} {borrowed}"
            n += 1
        entry["detail"] = f"{n} cases bit-exact"
    with report.check("qk_pair") as entry:
        xq, wq, angles, seq, heads = rank_inputs(P, "bshd", "per_head", torch.bfloat16, 90)
        xk, wk, _, _, _ = rank_inputs(P, "bshd", "per_head", torch.bfloat16, 91)
        a = angles[rank]
        q, k = fu.qk_norm_rope_all_to_all_qk(
            group,
            xq[rank],
            xk[rank],
            ("q", "k"),
            norm_weights=(wq, wk),
            eps=1e-6,
            cos=a.cos(),
            sin=a.sin(),
            norm="per_head",
            seq_splits=seq,
            head_splits=heads,
        )
        assert torch.equal(
            q, want(xq, wq, angles, "per_head", "interleaved", "bshd", seq, heads, rank)
        ), "q"
        assert torch.equal(
            k, want(xk, wk, angles, "per_head", "interleaved", "bshd", seq, heads, rank)
        ), "k"
        entry["detail"] = "q and k, one barrier"
    report.finish()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
