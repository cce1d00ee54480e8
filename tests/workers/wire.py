"""One rank of the FP8-on-the-wire test (`wire_dtype=`, fast_ulysses/wire.py), run by
tests/python/test_wire.py on gloo CPU ranks (TorchUlyssesGroup) and by tests/gpu/test_wire_gpu.py
with --shared-gpu (UlyssesGroup, every rank on cuda:0).

All ranks join one world; for each P the last P ranks form a subgroup. Per P, checks:
- moved_P<p>: for both wire formats, modes 0 and 1, every layout, even and uneven splits
  (zero-row and zero-head ranks), bf16 / fp16 / fp32 in turn: the owned call, the borrowed call,
  out= and all_to_all_4d (bshd) return, bit for bit, `simulate(..., wire_dtype=)` and the plain
  call of dequantize(quantize(x)); dequantize=False (owned and borrowed) returns the payload and
  scales the senders packed, byte for byte (the plain simulate of every rank's packed tensor);
- mismatch_P<p> (P > 1; on the fast group only with FAST_ULYSSES_DEBUG=1, its per-call check:
  without it a mismatch is the watchdog's, tests/workers/fast_mismatch.py): the first rank on
  another wire dtype (e5m2 vs e4m3fn, then fp8 vs none) raises FastUlyssesError on every rank,
  and the group works after;
- grads_P<p>: x.grad through a wire call equals x.grad through the plain call, bit for bit
  (straight-through: the backward moves the gradient in x's dtype);
- attention_P<p>: UlyssesAttention(wire_dtype=) (plain, GQA, pipeline=2) equals, bit for bit,
  the plain module run on round-tripped q, k, v with its output rows round-tripped, and stays
  within the row bound of that output;
- ring_P4 (gloo, a world of 4: the full tier's launch): UlyssesAttention(wire_dtype=) over
  Ulysses groups {0, 1}, {2, 3} and rings {0, 2}, {1, 3} (USP), as attention_P<p>;
- fused_P<p>: qk_norm_rope_all_to_all(..., wire_dtype=) equals the plain call of the round-trip
  of norm_rope_reference(x).
"""

from __future__ import annotations

import argparse
import itertools
import sys

import torch
import torch.distributed as dist
from multirank import run_on_subgroups, subgroup_sizes

import fast_ulysses as fu
from fast_ulysses import wire
from fast_ulysses.debug import debug_enabled
from fast_ulysses.fused import norm_rope_reference

D = 8
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
LAYOUTS = ("bshd", "sbhd", "bhsd")


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def same(a, b, what: str) -> None:
    if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(bits(a), bits(b)):
        raise AssertionError(f"{what}: {tuple(a.shape)} {a.dtype} vs {tuple(b.shape)} {b.dtype}")


def roundtrip(x, w):
    return wire.dequantize(*wire.unpack(wire.quantize(x, w)), dtype=x.dtype)


def shape_of(layout, b, s, h):
    return tuple({"b": b, "s": s, "h": h, "d": D}[c] for c in layout)


def rank_inputs(P, mode, layout, seq, heads, dtype, seed):
    seq_r, heads_r = seq or [2] * P, heads or [2] * P
    g = torch.Generator().manual_seed(seed)
    shapes = [
        shape_of(layout, 2, seq_r[r], sum(heads_r))
        if mode == 0
        else shape_of(layout, 2, sum(seq_r), heads_r[r])
        for r in range(P)
    ]
    return [(torch.randn(s, generator=g) * 4).to(dtype) for s in shapes]


def split_cases(P):
    uneven = ([(3 * r + 2) % 4 for r in range(P)], [2, 1, 0, 1][:P]) if P > 1 else ([3], [3])
    return [(None, None), uneven]


def check_moved(group, P, device) -> int:
    rank, count = group.rank, 0
    for (seq, heads), mode, layout, w in itertools.product(
        split_cases(P), (0, 1), LAYOUTS, (E4M3, E5M2)
    ):
        dtype = DTYPES[count % 3]
        xs = rank_inputs(P, mode, layout, seq, heads, dtype, 100 * P + count)
        kw = dict(seq_splits=seq, head_splits=heads, layout=layout)
        where = f"case {count} (mode {mode} {layout} {w} {dtype} seq {seq} heads {heads})"
        want = fu.simulate(xs, mode, wire_dtype=w, **kw)[rank]
        sent = fu.simulate([wire.quantize(x, w) for x in xs], mode, **kw)[rank]
        x = xs[rank].to(device)
        same(group.all_to_all_single_4d(x, mode, "w", wire_dtype=w, **kw), want, f"owned {where}")
        plain = group.all_to_all_single_4d(roundtrip(x, w), mode, "plain", **kw)
        same(plain, want, f"plain call of the round trip {where}")
        got = group.all_to_all_single_4d_borrowed(x, mode, "wb", wire_dtype=w, **kw)
        same(got, want, f"borrowed {where}")
        out = torch.full_like(want, float("nan"), device=device)
        got = group.all_to_all_single_4d(x, mode, "w", wire_dtype=w, out=out, **kw)
        assert got is out
        same(out, want, f"out= {where}")
        for entry in (group.all_to_all_single_4d, group.all_to_all_single_4d_borrowed):
            payload, scales = entry(x, mode, "wp", wire_dtype=w, dequantize=False, **kw)
            same(payload, sent[..., :D], f"{entry.__name__} payload {where}")
            same(scales, sent[..., D:].contiguous().view(torch.float32)[..., 0], f"scales {where}")
        if layout == "bshd":
            got = group.all_to_all_4d(x, mode, seq_splits=seq, head_splits=heads, wire_dtype=w)
            same(got, want, f"all_to_all_4d {where}")
        count += 1
    return count


def check_mismatch(group, P, device) -> None:
    x = torch.randn(1, 2, 2 * P, D, device=device)
    first = group.rank == 0
    for mine, theirs in ((E5M2, E4M3), (E4M3, None)):
        try:
            group.all_to_all_single_4d(x, 0, "mm", wire_dtype=mine if first else theirs)
        except fu.FastUlyssesError:
            pass
        else:
            raise AssertionError(f"wire_dtype {mine} on rank 0 vs {theirs}: no error")
    same(
        group.all_to_all_single_4d(x, 0, "after", wire_dtype=E4M3),
        group.all_to_all_single_4d(roundtrip(x, E4M3), 0, "after"),
        "a call after the mismatch",
    )


def check_grads(group, P, device) -> int:
    count = 0
    for (seq, heads), mode, layout in itertools.product(split_cases(P), (0, 1), LAYOUTS):
        dtype = (torch.float32, torch.bfloat16)[count % 2]
        x0 = rank_inputs(P, mode, layout, seq, heads, dtype, 7 * P + count)[group.rank]
        kw = dict(seq_splits=seq, head_splits=heads, layout=layout)
        grads = []
        for w in (E4M3, None):
            x = x0.to(device).requires_grad_()
            y = group.all_to_all_single_4d(x, mode, "g", wire_dtype=w, **kw)
            weight = torch.arange(y.numel(), dtype=torch.float32, device=device) % 7 - 3
            (y.float() * weight.view(y.shape)).sum().backward()
            grads.append(x.grad)
        same(grads[0], grads[1], f"x.grad, mode {mode} {layout} {dtype} seq {seq}")
        count += 1
    return count


def check_attention(group, P, device) -> None:
    g = torch.Generator().manual_seed(P)
    seq = [2 + r for r in range(P)]
    for name, kv_heads, pipeline in (("plain", 2 * P, 1), ("gqa", P, 1), ("pipeline", 2 * P, 2)):
        shapes = [(1, seq[group.rank], 2 * P, D), (1, seq[group.rank], kv_heads, D)]
        q, k, v = (torch.randn(shapes[min(i, 1)], generator=g).to(device) for i in range(3))
        wired = fu.UlyssesAttention(group, pipeline=pipeline, wire_dtype=E4M3)
        got = wired(q, k, v, seq_splits=seq)
        inner = fu.UlyssesAttention(group, pipeline=pipeline)(
            *(roundtrip(t, E4M3) for t in (q, k, v)), seq_splits=seq
        )
        # The output rows travel quantized too: the plain module's output, round-tripped.
        same(got, roundtrip(inner, E4M3), f"UlyssesAttention {name}")
        amax = inner.float().abs().amax(-1, keepdim=True)
        assert ((got.float() - inner.float()).abs() <= amax * 2**-4).all(), name


def check_ring(device) -> None:
    rank = dist.get_rank()  # (a world of 4: every rank makes every new_group, in one order)
    ulysses = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    rings = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    group = fu.TorchUlyssesGroup(ulysses[rank // 2])
    g = torch.Generator().manual_seed(rank)
    q, k, v = (torch.randn(1, 3, 4, D, generator=g).to(device) for _ in range(3))
    got = fu.UlyssesAttention(group, ring_group=rings[rank % 2], wire_dtype=E4M3)(q, k, v)
    inner = fu.UlyssesAttention(group, ring_group=rings[rank % 2])(
        *(roundtrip(t, E4M3) for t in (q, k, v))
    )
    same(got, roundtrip(inner, E4M3), "UlyssesAttention with a ring")
    group.destroy()


def check_fused(group, P, device) -> None:
    seq, heads = [3, 1, 4, 2][:P], [2, 0, 3, 1][:P]
    g = torch.Generator().manual_seed(P)
    x = (torch.randn(2, seq[group.rank], sum(heads), D, generator=g) * 3).to(device)
    w = (torch.rand(sum(heads) * D, generator=g) + 0.5).to(device)
    angles = torch.rand(seq[group.rank], D // 2, generator=g).to(device) * 6.28
    args = dict(norm_weight=w, eps=1e-6, cos=angles.cos(), sin=angles.sin())
    kw = dict(seq_splits=seq, head_splits=heads)
    got = fu.qk_norm_rope_all_to_all(group, x, "f", wire_dtype=E4M3, **args, **kw)
    y = norm_rope_reference(x, w, 1e-6, angles.cos(), angles.sin())
    same(got, group.all_to_all_single_4d(roundtrip(y, E4M3), 0, "fp", **kw), "fused + wire")


def make(pg, shared_gpu):
    if shared_gpu:
        return fu.UlyssesGroup(pg, 1 << 20), torch.device("cuda", 0)
    return fu.TorchUlyssesGroup(pg), torch.device("cpu")


CHECKS = (
    ("mismatch", check_mismatch),
    ("grads", check_grads),
    ("attention", check_attention),
    ("fused", check_fused),
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared-gpu", action="store_true", help="UlyssesGroup on cuda:0")
    args = parser.parse_args()

    def body(report, pg, P, _device):
        group, device = make(pg, args.shared_gpu)
        with report.check(f"moved_P{P}") as entry:
            entry["detail"] = f"{check_moved(group, P, device)} cases"
        for name, fn in CHECKS:
            if name == "mismatch" and not checks_mismatch(P, args.shared_gpu, debug_enabled()):
                continue
            with report.check(f"{name}_P{P}"):
                fn(group, P, device)
        group.destroy()
        if P == 4 and not args.shared_gpu:
            with report.check("ring_P4"):
                check_ring(device)

    return run_on_subgroups(args.shared_gpu, body)


def checks_mismatch(P: int, shared_gpu: bool, debug: bool) -> bool:
    return P > 1 and (debug or not shared_gpu)


def check_names(world: int, shared_gpu: bool = False, debug: bool = False) -> list[str]:
    """Every check a rank of a `world`-rank run reports (for the last rank)."""
    return [
        f"{c}_P{P}"
        for P in subgroup_sizes(world, shared_gpu)
        for c in ("moved", "mismatch", "grads", "attention", "fused")
        if c != "mismatch" or checks_mismatch(P, shared_gpu, debug)
    ] + (["ring_P4"] if world == 4 and not shared_gpu else [])


if __name__ == "__main__":
    sys.exit(main())
