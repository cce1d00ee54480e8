"""CUDA-event timing: warm-up, then the median of per-iteration times.

The timed iterations are queued behind a spin kernel (`torch.cuda._sleep`) long enough for the
host to issue all of them, so each event pair brackets device time only. Without it, an op whose
host issue is not much shorter than its device time (a few-microsecond copy issued through
Python, several copies per iteration) is timed as the host's issue rate, not the GPU's.

Also here: the GEMM-chain overlap (sized to the collective, repeated, summarized) and the
capture of one call in a CUDA graph for --graph.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch

MAX_HOLD_MS = 1000.0  # the spin never exceeds this (1 s per timed block)
_cycles_per_ms: dict[int, float] = {}


def hold_ms(issue_ms: float, iters: int) -> float:
    """How long to hold the device before `iters` iterations whose host issue takes `issue_ms`
    each: twice the issue time plus 0.2 ms, at most MAX_HOLD_MS."""
    return min(2.0 * max(issue_ms, 0.0) * iters + 0.2, MAX_HOLD_MS)


def hold_device(ms: float) -> None:
    """Queues a spin of about `ms` on the current stream (calibrated once per device)."""
    device = torch.cuda.current_device()
    if device not in _cycles_per_ms:
        cycles = 10_000_000
        torch.cuda._sleep(1000)
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        stop.record()
        stop.synchronize()
        _cycles_per_ms[device] = cycles / max(start.elapsed_time(stop), 1e-3)
    torch.cuda._sleep(int(ms * _cycles_per_ms[device]))


def _issue_ms(fn: Callable[[], object], calls: int) -> float:
    """Host ms to issue one fn() with the device idle (so the host never waits for it)."""
    return host_us(fn, calls) / 1e3


def median_ms(fn: Callable[[], object], iters: int, warmup: int) -> float:
    """Median device time of one fn() in ms, each iteration bracketed by CUDA events on the
    current stream (fn must leave its work ordered before the current stream's next op).
    Every rank makes the same fn() calls (warmup + 3 + iters): collectives stay matched."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    issue = _issue_ms(fn, 3)
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(iters)
    ]
    hold_device(hold_ms(issue, iters))
    for start, stop in events:
        start.record()
        fn()
        stop.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(stop) for start, stop in events)


def host_us(fn: Callable[[], object], iters: int) -> float:
    """CPU microseconds to issue one fn() (no synchronize inside the loop)."""
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for _ in range(iters):
        fn()
    t1 = time.perf_counter_ns()
    torch.cuda.synchronize()
    return (t1 - t0) / 1e3 / iters


# The overlap chain: at least as long as the collective (else even a fully hidden collective
# reads below 100%: the part beyond the chain has nothing to hide behind) and less than 1.5x it
# (else GEMM noise, which grows with the chain, decides `hidden`).
MAX_GEMM_FRACTION = 0.5  # one GEMM longer than this fraction of the collective: halve its size
MIN_GEMM_SIZE = 128


def chain_length(gemm_ms: float, target_ms: float) -> int:
    """GEMMs in the shortest chain at least target_ms long when one takes gemm_ms (>= 1)."""
    return max(1, math.ceil(round(target_ms / gemm_ms, 6))) if gemm_ms > 0 else 1


def smaller_gemm(size: int, gemm_ms: float, target_ms: float) -> int | None:
    """Half the GEMM size while one GEMM is longer than MAX_GEMM_FRACTION of the target (so the
    chain overshoots it by less than that), None when it fits or the size is MIN_GEMM_SIZE."""
    if gemm_ms <= MAX_GEMM_FRACTION * target_ms or size <= MIN_GEMM_SIZE:
        return None
    return max(size // 2, MIN_GEMM_SIZE)


def spread(values: list) -> dict:
    """Median, min and max of the values that were measured (None: not measured)."""
    present = [v for v in values if v is not None]
    if not present:
        return {"median": None, "min": None, "max": None}
    return {"median": statistics.median(present), "min": min(present), "max": max(present)}


def on_side(collective: Callable[[], object]) -> Callable[[], None]:
    """collective() on a side stream, ordered after and before the current stream's work."""
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()

    def run():
        side.wait_stream(main)
        with torch.cuda.stream(side):
            collective()
        main.wait_stream(side)

    return run


def overlap_once(
    gemms: Callable[[], object], collective: Callable[[], object], iters: int, warmup: int
) -> dict:
    """GEMM chain on the current stream with the collective on a side stream beside it.
    hidden = (t_gemm + t_coll - t_both) / t_coll, not clipped: below 0 the collective slowed
    the GEMMs by more than its own time (SMs taken); a little above 1 is noise."""
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()

    def both():
        side.wait_stream(main)
        with torch.cuda.stream(side):
            collective()
        gemms()
        main.wait_stream(side)

    g = median_ms(gemms, iters, warmup)
    c = median_ms(on_side(collective), iters, warmup)
    b = median_ms(both, iters, warmup)
    hidden = (g + c - b) / c if c > 0 else None
    return {"gemm_ms": g, "collective_ms": c, "both_ms": b, "hidden": hidden}


def summarize_overlap(runs: list[dict]) -> dict:
    """Repeated overlap_once results: the median of each time, hidden's median (`hidden`) and
    spread (`hidden_min`, `hidden_max`), and every run."""
    hidden = spread([r["hidden"] for r in runs])
    out = {
        key: spread([r[key] for r in runs])["median"]
        for key in ("gemm_ms", "collective_ms", "both_ms")
    }
    out.update(
        hidden=hidden["median"], hidden_min=hidden["min"], hidden_max=hidden["max"], runs=runs
    )
    return out


def overlap(
    gemms: Callable[[], object],
    collective: Callable[[], object],
    iters: int,
    warmup: int,
    repeats: int = 1,
) -> dict:
    """overlap_once `repeats` times (GEMM noise moves `hidden` between runs), summarized."""
    return summarize_overlap(
        [overlap_once(gemms, collective, iters, warmup) for _ in range(max(repeats, 1))]
    )


def capture(fn: Callable[[], object]) -> torch.cuda.CUDAGraph:
    """One eager fn() (warm-up: sizes windows, lazy init), then one fn() captured in a CUDA
    graph; both on a side stream, as torch recommends. fn's inputs must stay alive (static)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        fn()
    return graph


def first_error(errors: list) -> str | None:
    """The first rank's error among every rank's (None: every rank succeeded)."""
    for rank, error in enumerate(errors):
        if error is not None:
            return f"rank {rank}: {error}"
    return None


def agreed_error(error: str | None) -> str | None:
    """The first rank's error among every rank's, gathered over the default group (None: every
    rank succeeded): every rank reaches the same verdict, so all skip a timing or none does."""
    import torch.distributed as dist

    errors = [None] * dist.get_world_size()
    dist.all_gather_object(errors, error)
    return first_error(errors)
