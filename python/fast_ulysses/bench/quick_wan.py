"""Quick measurement: Wan 2.1 720p mode 0 (b=1, 75,600 tokens, 40 heads, d=128, bf16) on P
ranks, fast-ulysses copy and borrowed: device time per call (CUDA events over back-to-back
calls) and host CPU microseconds per call (issue time, no synchronize inside the loop).
`borrowed-op` calls the op directly (torch.ops.fast_ulysses...), without the Python method: the
difference to `borrowed` is the wrapper's cost. `dispatch-only` calls the op
`fast_ulysses::check_device` (the group lookup and its device rule, no CUDA work): what reaching
any of the ops from Python costs on this machine. Each row also says how many of its calls were
launched from cached CUDA graphs (FAST_ULYSSES_EAGER_GRAPHS, on unless set to 0). With
FAST_ULYSSES_HOST_PROFILE=1 it also prints where the host time goes, stage by stage (each
stage's mean microseconds per call, the largest over the ranks). Last, "first call at a new
address": borrowed calls one at a time, each with x where no call had it before (with the cache
on, each captures and instantiates a graph first). Where the group has the upstream's names
(fast_ulysses.upstream), five rows more: `all_to_all_4d` (the owned call by that name),
`empty_output+out` (into a buffer the peers write directly), `async` and `lend`
(all_to_all_4d_async, without and with lend=True), and `packed-view` (the copy call on x as the
view [:, :, 0] of a packed (1, s, 3, 40, 128) projection, no .contiguous()).

    FAST_ULYSSES_ALLOW_SHARED_GPU=1 torchrun --standalone --nproc-per-node 8 \
        -m fast_ulysses.bench.quick_wan --shared-gpu

With --shared-gpu all ranks share cuda:0: the numbers are same-device SM copies contending for
one GPU, not NVLink numbers. Prints the slowest rank's medians; JSON with --json PATH.

--staggered times each rank's host issue alone: the ranks take turns (a gloo barrier between
turns; the waiting ranks sleep in it), so no other rank competes for the CPU or the driver
while one issues. The calls still complete only once every rank has issued its share, so the
device time is not measured in this mode. With ranks sharing one GPU on one host, the
difference to the default mode is what the other ranks' concurrent issue costs.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import torch
import torch.distributed as dist

import fast_ulysses as fu
from fast_ulysses.presets import even_splits


def measure(
    call, iters: int, warmup: int, after_warmup=lambda: None, staggered: bool = False
) -> tuple[float, float]:
    """Median device ms and host us per call over 5 runs of `iters` calls (device ms is NaN
    when staggered: see the module's docstring)."""
    for _ in range(warmup):
        call()
    torch.cuda.synchronize()
    after_warmup()
    rank, P = dist.get_rank(), dist.get_world_size()
    device_ms, host_us = [], []
    for _ in range(5):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for turn in range(P if staggered else 1):
            if staggered:
                dist.barrier()
            if not staggered or turn == rank:
                t0 = time.perf_counter_ns()
                for _ in range(iters):
                    call()
                t1 = time.perf_counter_ns()
        stop.record()
        torch.cuda.synchronize()
        device_ms.append(float("nan") if staggered else start.elapsed_time(stop) / iters)
        host_us.append((t1 - t0) / 1e3 / iters)
    return statistics.median(device_ms), statistics.median(host_us)


def first_calls(group, x, kw, profiling: bool, calls: int = 5) -> dict:
    """Host us of borrowed calls whose x is at an address no earlier call used (each input kept
    alive, so the next one is elsewhere): with the eager-graph cache on, each such call
    captures and instantiates a graph before launching it. One call at a time (synchronized
    before and after, so its time is its own); the slowest rank's median."""
    kept, us = [], []
    launched = group.stats().get("graph_calls", 0)
    for _ in range(calls):
        fresh = x.clone()
        kept.append(fresh)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter_ns()
        group.all_to_all_single_4d_borrowed(fresh, 0, "qb", **kw)
        us.append((time.perf_counter_ns() - t0) / 1e3)
        torch.cuda.synchronize()
    if profiling:
        group._host_profile()  # (not reported: these calls would skew the stage means)
    median = torch.tensor([statistics.median(us)], dtype=torch.float64)
    dist.all_reduce(median, op=dist.ReduceOp.MAX)
    fewest = torch.tensor([group.stats().get("graph_calls", 0) - launched], dtype=torch.int64)
    dist.all_reduce(fewest, op=dist.ReduceOp.MIN)
    return {
        "host_us_per_call": median.item(),
        "ms_per_call": float("nan"),
        "calls": calls,
        "graph_calls_fewest_rank": int(fewest.item()),
    }


def upstream_rows(group, x, kw) -> list:
    """The upstream names' rows (the module's docstring)."""
    buffer = group.empty_output(x, 0, **kw)
    packed = torch.empty(*x.shape[:2], 3, *x.shape[2:], dtype=x.dtype, device=x.device)
    packed[:, :, 0] = x
    view = packed[:, :, 0]
    return [
        ("all_to_all_4d", lambda: _wait(group.all_to_all_4d(x, 0, **kw))),
        ("empty_output+out", lambda: group.all_to_all_4d(x, 0, out=buffer, **kw)),
        ("async", lambda: _wait(group.all_to_all_4d_async(x, 0, **kw))),
        ("lend", lambda: _wait(group.all_to_all_4d_async(x, 0, lend=True, **kw))),
        ("packed-view", lambda: _wait(group.all_to_all_single_4d(view, 0, "qp", **kw))),
    ]


def _wait(t):
    """What the first aten op on an AsyncCollectiveTensor does: stream-ordered wait."""
    return t.wait() if hasattr(t, "wait") else t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared-gpu", action="store_true")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument(
        "--staggered",
        action="store_true",
        help="time each rank's host issue while the other ranks wait",
    )
    parser.add_argument("--json")
    args = parser.parse_args()
    dist.init_process_group("gloo" if args.shared_gpu else "nccl")
    rank, P = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", 0 if args.shared_gpu else rank)
    torch.cuda.set_device(device)
    # (make_group: it judges the links itself, in this tree and in older ones ab runs)
    group = fu.make_group(dist.group.WORLD, 256 << 20, prefer="fast")
    tokens, heads = 75_600, 40
    seq, hsplit = even_splits(tokens, P), even_splits(heads, P)
    x = torch.randn(1, seq[rank], heads, 128, dtype=torch.bfloat16, device=device)
    kw = dict(seq_splits=seq, head_splits=hsplit)
    op = torch.ops.fast_ulysses.all_to_all_single_4d_borrowed
    check_device = torch.ops.fast_ulysses.check_device
    profiling = fu.env.switch("FAST_ULYSSES_HOST_PROFILE")  # (the group has parsed it already)
    reset = (lambda: group._host_profile()) if profiling else (lambda: None)
    results = {}
    rows = [
        ("copy", lambda: _wait(group.all_to_all_single_4d(x, 0, "q", **kw))),
        ("borrowed", lambda: group.all_to_all_single_4d_borrowed(x, 0, "qb", **kw)),
        ("borrowed-op", lambda: op(x, 0, "qb", group.group_name, seq, hsplit, "bshd", True, rank)),
        ("dispatch-only", lambda: check_device(group.group_name, x)),
    ]
    if hasattr(group, "all_to_all_4d"):  # (older trees measured by scripts/device.sh lack them)
        rows += upstream_rows(group, x, kw)
    for name, call in rows:
        launched = group.stats().get("graph_calls", 0)  # (older trees have no such count)
        ms, us = measure(call, args.iters, warmup=3, after_warmup=reset, staggered=args.staggered)
        launched = group.stats().get("graph_calls", 0) - launched
        stats = torch.tensor([ms, us], dtype=torch.float64)
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)
        fewest = torch.tensor([launched], dtype=torch.int64)
        dist.all_reduce(fewest, op=dist.ReduceOp.MIN)
        results[name] = {
            "ms_per_call": stats[0].item(),
            "host_us_per_call": stats[1].item(),
            "calls": 3 + 5 * args.iters,  # warm-up and timed, per rank
            "graph_calls_fewest_rank": int(fewest.item()),
        }
        if profiling:
            stages = group._host_profile()["us_per_call"]
            t = torch.tensor(list(stages.values()), dtype=torch.float64)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            results[name]["host_us_by_stage"] = dict(zip(stages, t.tolist()))
    results["first call at a new address"] = first_calls(group, x, kw, profiling)
    wide = group.stats().get("wide_flags", 0)  # (older trees have no such key)
    group.destroy()
    if rank == 0:
        sent = x.numel() * x.element_size()
        label = "ranks share one GPU (not NVLink)" if args.shared_gpu else "one GPU per rank"
        if args.staggered:
            label += "; staggered: each rank's issue timed alone, device time not measured"
        flags = "two per 64-bit operation" if wide else "one per 32-bit operation"
        print(
            f"Wan 720p mode 0, P={P}, {label}; {sent / 1e6:.1f} MB in per rank; "
            f"handshake flags {flags}"
        )
        for name, r in results.items():
            ms = r["ms_per_call"]
            device = (
                "n/a ms/call"
                if math.isnan(ms)
                else f"{ms:.3f} ms/call (slowest rank), {sent / ms / 1e6:.0f} GB/s per rank"
            )
            print(
                f"  {name:11s} {r['host_us_per_call']:.1f} us host CPU/call, {device}; "
                f"{r['graph_calls_fewest_rank']} of {r['calls']} calls launched from cached "
                "graphs (fewest on any rank)"
            )
            if "host_us_by_stage" in r and name != "dispatch-only":
                staged = sum(r["host_us_by_stage"].values())
                print(
                    "            host us by stage: "
                    + ", ".join(f"{k} {v:.1f}" for k, v in r["host_us_by_stage"].items())
                    + f"; outside the stages {r['host_us_per_call'] - staged:.1f} (slowest "
                    "rank's call less each stage's largest mean: an estimate)"
                )
        if args.json:
            for r in results.values():
                if math.isnan(r["ms_per_call"]):
                    r["ms_per_call"] = None
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "world_size": P,
                        "shared_gpu": args.shared_gpu,
                        "staggered": args.staggered,
                        "wide_flags": bool(wide),
                        "bytes_in_per_rank": sent,
                        **results,
                    },
                    f,
                    indent=2,
                )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
