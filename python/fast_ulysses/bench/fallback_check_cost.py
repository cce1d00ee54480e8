"""What TorchUlyssesGroup's call check costs on gloo: 2 CPU ranks on this machine.

Every call of the fallback at P > 1 first exchanges one small int64 row per rank
(all_gather_into_tensor) saying what the rank believes the call is; FAST_ULYSSES_CHECK_CALLS=0
turns that off. This script builds one group with the check on and one with it off (the switch
is read when a group is built) and times, alternating on and off in every repetition:

- a Wan 720p-shaped call at P = 2: x of shape (1, 37800, 40, 128) bf16 per rank, mode 0 (the
  sequence split over 2 ranks, 75600 tokens, 40 heads); --seq takes a shorter sequence;
- a tiny call, (1, 1, 2, 8) bf16, where the check is most of the call: its on - off difference
  is the check's own cost.

Each timed call starts after a barrier (not timed), so both ranks enter it together; rank 0's
wall-clock times are reported, as medians. The share is the tiny call's on - off difference
over the Wan call's median with the check off. It prints its table; --json also writes the
record (the one quoted in docs/BENCHMARK.md, from the repository root):

    python -m fast_ulysses.bench.fallback_check_cost [--seq 37800] [--reps 7] [--tiny-reps 400]
        [--json benchmarks/results/cpu-gloo-p2-fallback-check-cost.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

P = 2
HEADS, HEAD_DIM, WAN_SEQ = 40, 128, 37800  # Wan 720p: 75600 tokens, 40 heads of 128
CHECK_ENV = "FAST_ULYSSES_CHECK_CALLS"


def timed(group, x, tag) -> float:
    """Seconds of one call on rank 0's clock, both ranks released together by a barrier."""
    dist.barrier()
    start = time.perf_counter()
    group.all_to_all_single_4d(x, 0, tag)
    return time.perf_counter() - start


def alternate(groups, x, tag, reps, warmup) -> dict[str, list[float]]:
    """Times `reps` calls per group, alternating the groups within every repetition."""
    for _ in range(warmup):
        for group in groups.values():
            group.all_to_all_single_4d(x, 0, tag)
    times: dict[str, list[float]] = {name: [] for name in groups}
    for _ in range(reps):
        for name, group in groups.items():
            times[name].append(timed(group, x, tag))
    return times


def worker(rank: int, port: int, args, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)  # two ranks on a small machine: one core each
    dist.init_process_group("gloo", rank=rank, world_size=P)
    import fast_ulysses as fu

    os.environ.pop(CHECK_ENV, None)
    checked = fu.TorchUlyssesGroup()
    os.environ[CHECK_ENV] = "0"
    unchecked = fu.TorchUlyssesGroup()
    os.environ.pop(CHECK_ENV)
    groups = {"check_on": checked, "check_off": unchecked}

    tiny = torch.zeros(1, 1, 2, 8, dtype=torch.bfloat16)
    tiny_times = alternate(groups, tiny, "tiny", args.tiny_reps, warmup=20)

    g = torch.Generator().manual_seed(rank)
    x = torch.randn(1, args.seq, HEADS, HEAD_DIM, generator=g).to(torch.bfloat16)
    wan_times = alternate(groups, x, "wan", args.reps, warmup=1)
    if rank == 0:
        queue.put({"tiny": tiny_times, "wan": wan_times})
    dist.barrier()
    dist.destroy_process_group()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--seq",
        type=int,
        default=WAN_SEQ,
        help=f"rows per rank of the Wan-shaped call (Wan 720p: {WAN_SEQ})",
    )
    parser.add_argument("--reps", type=int, default=7, help="timed Wan calls per setting")
    parser.add_argument("--tiny-reps", type=int, default=400, help="timed tiny calls per setting")
    parser.add_argument("--json", type=Path, help="also write the record here")
    args = parser.parse_args()

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    mp.start_processes(worker, args=(free_port(), args, queue), nprocs=P, start_method="spawn")
    raw = queue.get()

    def median_ms(times):
        return statistics.median(times) * 1e3

    shape = [1, args.seq, HEADS, HEAD_DIM]
    wan = {name: median_ms(t) for name, t in raw["wan"].items()}
    tiny = {name: median_ms(t) for name, t in raw["tiny"].items()}
    check_ms = tiny["check_on"] - tiny["check_off"]
    share = check_ms / wan["check_off"]
    measured_share = (wan["check_on"] - wan["check_off"]) / wan["check_off"]
    spread = {name: (min(t) * 1e3, max(t) * 1e3) for name, t in raw["wan"].items()}
    note = (
        "Wan 720p shape"
        if args.seq == WAN_SEQ
        else f"a shorter sequence than Wan 720p's {WAN_SEQ} rows per rank (--seq {args.seq})"
    )
    result = {
        "what": "TorchUlyssesGroup call check (FAST_ULYSSES_CHECK_CALLS) on gloo, 2 CPU ranks "
        "of one machine; rank 0's wall-clock time per call after a barrier, median",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads_per_rank": 1,
        },
        "P": P,
        "mode": 0,
        "layout": "bshd",
        "dtype": "bfloat16",
        "shape_per_rank": shape,
        "shape_note": note,
        "bytes_per_rank": args.seq * HEADS * HEAD_DIM * 2,
        "reps": args.reps,
        "tiny_reps": args.tiny_reps,
        "wan_median_ms": wan,
        "tiny_median_ms": tiny,
        "check_ms": check_ms,
        "check_share_of_wan_call": share,
        "wan_on_minus_off_share": measured_share,
        "wan_range_ms": {name: [lo, hi] for name, (lo, hi) in spread.items()},
        "raw_ms": {
            kind: {name: [t * 1e3 for t in times] for name, times in runs.items()}
            for kind, runs in raw.items()
        },
    }
    rows = [
        ("Wan-shaped call " + str(tuple(shape)), wan["check_on"], wan["check_off"]),
        ("tiny call (1, 1, 2, 8)", tiny["check_on"], tiny["check_off"]),
    ]
    print(f"TorchUlyssesGroup call check, gloo, P={P}, bf16 mode 0 ({note}); medians, rank 0")
    print(f"{'call':<40} {'check on ms':>12} {'check off ms':>13} {'on - off ms':>12}")
    for name, on, off in rows:
        print(f"{name:<40} {on:>12.3f} {off:>13.3f} {on - off:>12.3f}")
    print(
        f"the check alone (tiny on - off): {check_ms:.3f} ms = {100 * share:.3f}% of the "
        f"Wan-shaped call ({wan['check_off']:.1f} ms with the check off)"
    )
    print(
        f"the Wan-shaped call's own on - off: {100 * measured_share:+.2f}%; its range over "
        f"{args.reps} repetitions: on {spread['check_on'][0]:.1f}-{spread['check_on'][1]:.1f} "
        f"ms, off {spread['check_off'][0]:.1f}-{spread['check_off'][1]:.1f} ms"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
