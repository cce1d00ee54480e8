"""torchrun worker: the fused QK RMSNorm + RoPE scatter (`fast_ulysses.qk_norm_rope_all_to_all`)
on UlyssesGroup against the unfused float32 reference (`fast_ulysses.fused.norm_rope_reference`)
followed by `fast_ulysses.simulate`, within one unit in the last place of the payload dtype.

    FAST_ULYSSES_ALLOW_SHARED_GPU=1 torchrun --nproc-per-node 3 \\
        tests/workers/fused_correctness.py --shared-gpu

Checks (each a `Report` entry; rank 0 prints one "ok" line per check and "N passed, 0 failed"):
  matrix       both norms x both RoPE styles x bf16/fp16 x bshd/sbhd x owned/borrowed, with uneven
               sequence and head splits (a rank with no heads included at P >= 3)
  qk_pair      q and k with one closing handshake (qk_norm_rope_all_to_all_qk)
  captured     an owned fused call captured in a CUDA graph, replayed with fresh inputs
  compiled     torch.compile(fullgraph=True) of a fused call (traced through its Meta kernel)
  eager_reuse  100 calls back to back on one tag, each checked
  kernel_paths every kernel, each case checked against the reference and, on rank 0, against
               the kernel torch.profiler saw launched (name, element type, units per thread):
               the 16-byte vector kernel fed by bulk copies (1 and 2 units per thread; bf16,
               fp16, fp32), the vector kernel that prefetches into registers (4 units per
               thread, and rows too large for the bulk copies' stages at 1 and 2 units), and
               the scalar kernel (a head_dim that is not a whole number of 16-byte pairs of
               groups, an input not 16-byte aligned). Below compute capability 9.0 the register
               kernel is expected where these say bulk
  refusals     bad arguments raise the C++ rule's ValueError before anything is sent; an input
               that requires grad is refused
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import re
import sys
import time

import torch
import torch.distributed as dist
from multirank import Report
from profiling import activities, init_profiler_for_graphs, kernel_names

import fast_ulysses as fu
from fast_ulysses.fused import (
    NORMS,
    ROPE_STYLES,
    norm_rope_reference,
    qk_norm_rope_all_to_all,
    qk_norm_rope_all_to_all_qk,
)

CHECKS = ("matrix", "qk_pair", "captured", "compiled", "eager_reuse", "kernel_paths", "refusals")
D = 64
EPS = 1e-6


def splits(P: int):
    """(seq_splits, head_splits): uneven, with a rank holding no heads at P >= 3."""
    seq = [3 + (r % 3) for r in range(P)]
    heads = [2 + (r % 2) for r in range(P)]
    if P >= 3:
        heads[1] = 0
    return seq, heads


def make_args(P, rank, dtype, layout, norm, seed, device, batch=2, d=D, total_heads=None):
    """Every rank's x (so every rank can compute the reference) and the shared weight, cos, sin;
    head_dim d, and splits(P)'s head counts, or total_heads heads in their proportions (the
    remainder on rank 0)."""
    seq, heads = splits(P)
    if total_heads is not None:
        weights = heads
        heads = [total_heads * w // sum(weights) for w in weights]
        heads[0] += total_heads - sum(heads)
    N = sum(heads)
    g = torch.Generator().manual_seed(seed)
    xs = []
    for r in range(P):
        shape = (batch, seq[r], N, d) if layout == "bshd" else (seq[r], batch, N, d)
        xs.append((torch.randn(shape, generator=g) * 3).to(dtype))
    weight = torch.rand(N * d if norm == "all_heads" else d, generator=g) + 0.5
    angles = [torch.rand(seq[r], d // 2, generator=g) * 6.28 for r in range(P)]
    return xs, weight, angles, seq, heads


# The kernels' element types as their template arguments print in a kernel's name.
KERNEL_TYPES = {torch.bfloat16: "__nv_bfloat16", torch.float16: "__half", torch.float32: "float"}


def kernel_pattern(kernel: str, dtype, units: int) -> str:
    """A regular expression for the name of the fused kernel `kernel` ("bulk", "register" or
    "scalar") instantiated for dtype and `units` units per thread."""
    t = re.escape(KERNEL_TYPES[dtype])
    if kernel == "bulk":
        return rf"norm_rope_bulk_kernel<\s*{t}\s*,\s*{units}\s*,"
    if kernel == "register":
        return rf"norm_rope_vector_kernel<\s*{t}\s*,\s*{units}\s*>"
    return rf"norm_rope_kernel<\s*{t}\s*>"


def ulp_at(want: torch.Tensor) -> torch.Tensor:
    """One ulp of `want`'s dtype at each element, as float32: the larger of the gaps to the
    neighbours above and below (they differ at powers of two, where a value rounded the other
    way lands a whole gap of the larger binade away)."""
    up = torch.nextafter(want, torch.full_like(want, float("inf"))).float() - want.float()
    down = want.float() - torch.nextafter(want, torch.full_like(want, float("-inf"))).float()
    return torch.maximum(up.abs(), down.abs())


def worst_miss(got: torch.Tensor, want: torch.Tensor) -> str | None:
    """None when every element of `got` is within one ulp of `want`'s dtype at want (ulp_at),
    or within float32 noise (2^-20 of the tensor's largest magnitude) where a rotation cancels
    to near zero and an ulp is smaller than float32's own rounding of the terms (the kernel and
    the reference sum in different orders). Otherwise the worst element: its index, both
    values, the difference and the allowance."""
    if got.shape != want.shape or got.dtype != want.dtype:
        return f"shape/dtype {tuple(got.shape)} {got.dtype} vs {tuple(want.shape)} {want.dtype}"
    if want.numel() == 0:
        return None
    noise = want.float().abs().max() * 2.0**-20
    allowed = torch.clamp(ulp_at(want), min=noise)
    diff = (got.float() - want.float()).abs()
    excess = diff - allowed
    if bool((excess <= 0).all()):
        return None
    i = int(excess.argmax())
    idx = tuple(int(v) for v in torch.unravel_index(torch.tensor(i), want.shape))
    return (
        f"{int((excess > 0).sum())} of {want.numel()} elements beyond one ulp; worst at "
        f"{idx}: got {got.flatten()[i].item()!r}, want {want.flatten()[i].item()!r}, "
        f"|diff| {diff.flatten()[i].item():.3g} > allowed {allowed.flatten()[i].item():.3g}"
    )


def expected(xs, weight, angles, norm, style, layout, seq, heads, rank):
    ys = [
        norm_rope_reference(
            x, weight, EPS, a.cos(), a.sin(), norm=norm, rope_style=style, layout=layout
        )
        for x, a in zip(xs, angles)
    ]
    return fu.simulate(ys, 0, seq_splits=seq, head_splits=heads, layout=layout)[rank]


class Checker:
    def __init__(self, group, rank, P, device, kernel_names=True):
        self.group, self.rank, self.P, self.device = group, rank, P, device
        self.kernel_names = kernel_names  # kernel_paths also checks which kernel ran

    def call(self, x, weight, angle, tag, norm, style, layout, seq, heads, borrowed):
        return qk_norm_rope_all_to_all(
            self.group,
            x.to(self.device),
            tag,
            norm_weight=weight.to(self.device),
            eps=EPS,
            cos=angle.cos().to(self.device),
            sin=angle.sin().to(self.device),
            norm=norm,
            rope_style=style,
            seq_splits=seq,
            head_splits=heads,
            layout=layout,
            borrowed=borrowed,
        )

    def matrix(self) -> str:
        n = 0
        for norm, style, dtype, layout, borrowed in itertools.product(
            NORMS, ROPE_STYLES, (torch.bfloat16, torch.float16), ("bshd", "sbhd"), (False, True)
        ):
            xs, w, angles, seq, heads = make_args(
                self.P, self.rank, dtype, layout, norm, seed=1000 + n, device=self.device
            )
            got = self.call(
                xs[self.rank], w, angles[self.rank], "m", norm, style, layout, seq, heads, borrowed
            ).cpu()
            want = expected(xs, w, angles, norm, style, layout, seq, heads, self.rank)
            miss = worst_miss(got, want)
            assert miss is None, (
                f"rank {self.rank}: {norm} {style} {dtype} {layout} borrowed={borrowed}: {miss}"
            )
            n += 1
        return f"matrix: {n} cases within one ulp of norm_rope_reference + simulate"

    def qk_pair(self) -> str:
        xq, wq, angles, seq, heads = make_args(
            self.P, self.rank, torch.bfloat16, "bshd", "all_heads", seed=7, device=self.device
        )
        xk, wk, _, _, _ = make_args(
            self.P, self.rank, torch.bfloat16, "bshd", "all_heads", seed=8, device=self.device
        )
        a = angles[self.rank]
        q, k = qk_norm_rope_all_to_all_qk(
            self.group,
            xq[self.rank].to(self.device),
            xk[self.rank].to(self.device),
            ("pq", "pk"),
            norm_weights=(wq.to(self.device), wk.to(self.device)),
            eps=EPS,
            cos=a.cos().to(self.device),
            sin=a.sin().to(self.device),
            seq_splits=seq,
            head_splits=heads,
        )
        for name, got, xs, w in (("q", q, xq, wq), ("k", k, xk, wk)):
            want = expected(
                xs, w, angles, "all_heads", "interleaved", "bshd", seq, heads, self.rank
            )
            miss = worst_miss(got.cpu(), want)
            assert miss is None, f"rank {self.rank}: qk pair, {name}: {miss}"
        return "qk_pair: q and k with one closing handshake, both within one ulp"

    def captured(self) -> str:
        norm, style, layout = "per_head", "half", "bshd"
        xs, w, angles, seq, heads = make_args(
            self.P, self.rank, torch.bfloat16, layout, norm, seed=11, device=self.device
        )
        static_x = xs[self.rank].to(self.device)
        wd = w.to(self.device)
        c = angles[self.rank].cos().to(self.device)
        s = angles[self.rank].sin().to(self.device)
        kw = dict(
            norm_weight=wd,
            eps=EPS,
            cos=c,
            sin=s,
            norm=norm,
            rope_style=style,
            seq_splits=seq,
            head_splits=heads,
            layout=layout,
        )
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: the window exists before capture
            qk_norm_rope_all_to_all(self.group, static_x, "g", **kw)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = qk_norm_rope_all_to_all(self.group, static_x, "g", **kw)
        for replay in range(5):
            fresh, _, _, _, _ = make_args(
                self.P,
                self.rank,
                torch.bfloat16,
                layout,
                norm,
                seed=100 + replay,
                device=self.device,
            )
            static_x.copy_(fresh[self.rank].to(self.device))
            graph.replay()
            want = expected(fresh, w, angles, norm, style, layout, seq, heads, self.rank)
            miss = worst_miss(static_out.cpu(), want)
            assert miss is None, f"rank {self.rank}: replay {replay}: {miss}"
        return "captured: 5 replays of a captured fused call, fresh inputs, within one ulp"

    def compiled(self) -> str:
        norm, style, layout = "all_heads", "interleaved", "bshd"
        xs, w, angles, seq, heads = make_args(
            self.P, self.rank, torch.bfloat16, layout, norm, seed=21, device=self.device
        )
        a = angles[self.rank]
        kw = dict(
            norm_weight=w.to(self.device),
            eps=EPS,
            cos=a.cos().to(self.device),
            sin=a.sin().to(self.device),
            norm=norm,
            rope_style=style,
            seq_splits=seq,
            head_splits=heads,
            layout=layout,
            borrowed=True,
        )

        def step(t):
            return qk_norm_rope_all_to_all(self.group, t, "c", **kw) * 1

        got = torch.compile(step, backend="aot_eager", fullgraph=True)(
            xs[self.rank].to(self.device)
        )
        want = expected(xs, w, angles, norm, style, layout, seq, heads, self.rank)
        miss = worst_miss(got.cpu(), want)
        assert miss is None, f"rank {self.rank}: compiled call: {miss}"
        return "compiled: torch.compile(fullgraph) traces the fused op, result within one ulp"

    def eager_reuse(self) -> str:
        norm, style, layout = "all_heads", "interleaved", "sbhd"
        for i in range(100):
            xs, w, angles, seq, heads = make_args(
                self.P, self.rank, torch.float16, layout, norm, seed=5000 + i, device=self.device
            )
            got = self.call(
                xs[self.rank],
                w,
                angles[self.rank],
                "r",
                norm,
                style,
                layout,
                seq,
                heads,
                borrowed=bool(i % 2),
            )
            want = expected(xs, w, angles, norm, style, layout, seq, heads, self.rank)
            miss = worst_miss(got.cpu(), want)
            assert miss is None, (
                f"rank {self.rank}: call {i} (borrowed={bool(i % 2)}) differs: {miss}"
            )
        return "eager_reuse: 100 calls on one tag back to back (owned and borrowed), each checked"

    def kernel_paths(self) -> str:
        # (label, dtype, d, heads, unaligned, (kernel, units per thread)). A unit is two 16-byte
        # groups: d / 16 per head for 2-byte types, d / 8 for fp32. Up to 256 units a token, a
        # thread holds 1; up to 1024, 2; more, 4 (register kernel). The bulk-copy kernel takes
        # 1 or 2 units a thread where two stages of a token row (plus its angles and sums) fit
        # in 48 KiB.
        cases = [
            ("bf16 d=64", torch.bfloat16, 64, None, False, ("bulk", 1)),
            ("fp16 d=128, 160 threads", torch.float16, 128, 40, False, ("bulk", 2)),
            ("bf16 d=128, 320 threads", torch.bfloat16, 128, 80, False, ("bulk", 2)),
            ("bf16 d=128, 136 heads", torch.bfloat16, 128, 136, False, ("register", 4)),
            (
                "fp32 d=128, 48 heads (24 KiB rows: too large for the bulk stages)",
                torch.float32,
                128,
                48,
                False,
                ("register", 2),
            ),
            (
                "bf16 d=4096, one head (16 KiB of angles a token: too large for the bulk stages)",
                torch.bfloat16,
                4096,
                1,
                False,
                ("register", 1),
            ),
            ("fp32 d=8", torch.float32, 8, None, False, ("bulk", 1)),
            ("bf16 d=24 (not whole units)", torch.bfloat16, 24, None, False, ("scalar", 0)),
            (
                "bf16 d=96 (6 units a head: sums through shared memory)",
                torch.bfloat16,
                96,
                None,
                False,
                ("bulk", 1),
            ),
            ("fp32 d=6", torch.float32, 6, None, False, ("scalar", 0)),
            ("bf16 d=64, x not 16-byte aligned", torch.bfloat16, 64, None, True, ("scalar", 0)),
        ]
        bulk_here = torch.cuda.get_device_capability(self.device)[0] >= 9
        n = 0
        for label, dtype, d, total_heads, unaligned, (kernel, units) in cases:
            if kernel == "bulk" and not bulk_here:
                kernel = "register"
            label = f"{kernel} kernel, {units} units/thread, {label}"
            # Rank 0 alone profiles (profiling.py says why).
            profiled = self.rank == 0 and self.kernel_names
            profiling = (
                torch.profiler.profile(activities=activities())
                if profiled
                else contextlib.nullcontext()
            )
            with profiling as prof:
                for norm, style, borrowed in itertools.product(NORMS, ROPE_STYLES, (False, True)):
                    xs, w, angles, seq, heads = make_args(
                        self.P,
                        self.rank,
                        dtype,
                        "bshd",
                        norm,
                        seed=9000 + n,
                        device=self.device,
                        d=d,
                        total_heads=total_heads,
                    )
                    x = xs[self.rank].to(self.device)
                    if unaligned:  # contiguous, one element into its storage
                        flat = torch.empty(x.numel() + 1, dtype=dtype, device=self.device)
                        x = flat[1:].view(x.shape).copy_(x)
                        assert x.is_contiguous() and x.data_ptr() % 16 != 0
                    got = self.call(
                        x, w, angles[self.rank], "k", norm, style, "bshd", seq, heads, borrowed
                    ).cpu()
                    want = expected(xs, w, angles, norm, style, "bshd", seq, heads, self.rank)
                    miss = worst_miss(got, want)
                    assert miss is None, (
                        f"rank {self.rank}: {label}, {norm} {style} borrowed={borrowed}: {miss}"
                    )
                    n += 1
                torch.cuda.synchronize()
            if profiled:
                fused = [nm for nm in kernel_names(prof) if "norm_rope" in nm]
                wrong = [
                    nm for nm in fused if not re.search(kernel_pattern(kernel, dtype, units), nm)
                ]
                assert fused and not wrong, (
                    f"rank 0: {label}: expected only {kernel_pattern(kernel, dtype, units)!r}, "
                    f"the profiler saw {sorted(set(fused)) or 'no fused kernel'}"
                )
        which = (
            "each launching the kernel expected (rank 0's profile)"
            if self.kernel_names
            else "which kernel ran not checked (--no-kernel-names)"
        )
        return (
            f"kernel_paths: {n} cases over the bulk, register and scalar kernels within one "
            f"ulp, {which}"
        )

    def refusals(self) -> str:
        xs, w, angles, seq, heads = make_args(
            self.P, self.rank, torch.bfloat16, "bshd", "all_heads", seed=3, device=self.device
        )
        x = xs[self.rank].to(self.device)
        good = dict(
            norm_weight=w.to(self.device),
            eps=EPS,
            cos=angles[self.rank].cos().to(self.device),
            sin=angles[self.rank].sin().to(self.device),
            seq_splits=seq,
            head_splits=heads,
        )
        bad = [
            ("norm", dict(good, norm="rms"), "norm='rms'"),
            ("rope_style", dict(good, rope_style="full"), "rope_style='full'"),
            ("weight", dict(good, norm_weight=good["norm_weight"][:D]), "norm_weight has"),
            ("cos", dict(good, cos=good["cos"].double()), "cos has shape"),
            ("layout", dict(good, layout="bhsd"), "layout='bhsd'"),
        ]
        for name, kw, needle in bad:
            try:
                qk_norm_rope_all_to_all(self.group, x, "bad", **kw)
            except ValueError as error:
                assert needle in str(error), f"{name}: {error}"
            else:
                raise AssertionError(f"rank {self.rank}: bad {name} was accepted")
        try:
            qk_norm_rope_all_to_all(self.group, x.clone().requires_grad_(), "bad", **good)
        except ValueError as error:
            assert "has no backward" in str(error), str(error)
        else:
            raise AssertionError("an input that requires grad was accepted")
        return f"refusals: {len(bad) + 1} bad calls raise ValueError naming the rule"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shared-gpu",
        action="store_true",
        help="every rank on cuda:0 over gloo (needs FAST_ULYSSES_ALLOW_SHARED_GPU=1)",
    )
    parser.add_argument(
        "--only",
        default=",".join(CHECKS),
        help="comma-separated checks to run, in their order (default: all of "
        f"them: {','.join(CHECKS)})",
    )
    parser.add_argument(
        "--no-kernel-names",
        action="store_true",
        help="kernel_paths checks results only, not which kernel ran (its "
        "torch.profiler cannot run under compute-sanitizer)",
    )
    args = parser.parse_args()
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in chosen if name not in CHECKS]
    if unknown or not chosen:
        parser.error(f"--only {args.only}: unknown {unknown}; checks: {', '.join(CHECKS)}")
    dist.init_process_group("gloo" if args.shared_gpu else "nccl")
    rank, P = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", 0 if args.shared_gpu else int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(device)
    if rank == 0 and "kernel_paths" in chosen and "captured" in chosen and not args.no_kernel_names:
        init_profiler_for_graphs(device)  # before the capture of "captured"
    start = time.time()
    report = Report(rank)
    group = fu.UlyssesGroup(dist.group.WORLD, 1 << 20)
    checker = Checker(group, rank, P, device, kernel_names=not args.no_kernel_names)
    lines = []
    for name in (c for c in CHECKS if c in chosen):
        with report.check(name) as entry:
            entry["detail"] = getattr(checker, name)()
            lines.append(entry["detail"])
    torch.cuda.synchronize()
    group.destroy()
    dist.barrier()
    if rank == 0:
        for line in lines:
            print(f"  ok  {line}")
        print(f"P={P}, {time.time() - start:.1f} s")
        print(f"{len(lines)} passed, 0 failed")
    report.finish()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
