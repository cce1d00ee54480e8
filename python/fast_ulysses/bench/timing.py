"""CUDA-event timing: warm-up, then the median of per-iteration times."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def median_ms(fn: Callable[[], object], iters: int, warmup: int) -> float:
    """Median device time of one fn() in ms, each iteration bracketed by CUDA events on the
    current stream (fn must leave its work ordered before the current stream's next op)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(iters)]
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
    hidden = (gemm + collective - both) / collective, clipped to [0, 1]."""
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
    hidden = max(0.0, min(1.0, (g + c - b) / c)) if c > 0 else 0.0
    return {"gemm_ms": g, "collective_ms": c, "both_ms": b, "hidden": hidden}
