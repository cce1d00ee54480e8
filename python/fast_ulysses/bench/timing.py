"""CUDA-event timing: warm-up, then the median of per-iteration times.

The timed iterations are queued behind a spin kernel (`torch.cuda._sleep`) long enough for the
host to issue all of them, so each event pair brackets device time only. Without it, an op whose
host issue is not much shorter than its device time (a few-microsecond copy issued through
Python, several copies per iteration) is timed as the host's issue rate, not the GPU's.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

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
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
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


def overlap(gemms: Callable[[], object], collective: Callable[[], object], iters: int,
            warmup: int) -> dict:
    """GEMM chain on the current stream with the collective on a side stream beside it.
    hidden = (gemm + collective - both) / collective, not clipped: below 0 the collective
    slowed the GEMMs by more than its own time (SMs taken); a little above 1 is noise."""
    side = torch.cuda.Stream()
    main = torch.cuda.current_stream()

    def both():
        side.wait_stream(main)
        with torch.cuda.stream(side):
            collective()
        gemms()
        main.wait_stream(side)

    def alone_on_side():
        side.wait_stream(main)
        with torch.cuda.stream(side):
            collective()
        main.wait_stream(side)

    g = median_ms(gemms, iters, warmup)
    c = median_ms(alone_on_side, iters, warmup)
    b = median_ms(both, iters, warmup)
    hidden = (g + c - b) / c if c > 0 else None
    return {"gemm_ms": g, "collective_ms": c, "both_ms": b, "hidden": hidden}
