"""FP8 on the wire: what its two passes cost on one device, the ops (`wire_quantize`,
`wire_dequantize`: one pass each) against the rule's torch reference (`wire.quantize_reference`,
`wire.dequantize`: several torch operations each), alternately, on one rank's input of Wan 2.1
720p (75,600 tokens / P, 40 heads, d = 128, bf16).

    python -m fast_ulysses.bench.wire_passes [--device cpu|cuda] [--p 16] [--json PATH]

Prints each route's median milliseconds per pass, round by round (the routes take turns within
each round); on CUDA, timed with events after a synchronize. Where the ops have no kernel for
the device, only the reference is timed.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from .. import wire

TOKENS, HEADS, HEAD_DIM = 75_600, 40, 128


def timed_ms(fn, device: torch.device, repeats: int) -> float:
    """The median of `repeats` runs of fn (after one warm-up), in milliseconds."""
    fn()
    runs = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            runs.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            fn()
            runs.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(runs)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--p", type=int, default=16, help="ranks the sequence is split over")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--wire", choices=["e4m3", "e5m2"], default="e4m3")
    p.add_argument("--json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    w = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[args.wire]
    x = torch.randn(1, TOKENS // args.p, HEADS, HEAD_DIM, device=device).to(torch.bfloat16)
    ops = torch.ops.fast_ulysses
    packed = wire.quantize_reference(x, w)
    routes = [
        ("quantize, torch reference", lambda: wire.quantize_reference(x, w)),
        ("dequantize, torch reference", lambda: wire.dequantize(*wire.unpack(packed), x.dtype)),
    ]
    if wire._on_kernels(x):
        routes += [
            ("quantize, op", lambda: ops.wire_quantize(x, w)),
            ("dequantize, op", lambda: ops.wire_dequantize(packed, x.dtype)),
        ]
    ms = {name: [] for name, _ in routes}
    for _ in range(args.rounds):
        for name, fn in routes:
            ms[name].append(timed_ms(fn, device, args.repeats))
    print(f"FP8 wire passes ({w}), x {tuple(x.shape)} bf16 on {device}: ms per pass, by round")
    for name, values in ms.items():
        print(f"  {name:28s} " + "  ".join(f"{v:8.2f}" for v in values))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": str(device),
                    "device_name": torch.cuda.get_device_name(device)
                    if device.type == "cuda"
                    else platform.processor() or platform.machine(),
                    "threads": torch.get_num_threads(),
                    "shape": list(x.shape),
                    "wire_dtype": str(w),
                    "ms_per_pass_by_round": ms,
                },
                f,
                indent=2,
            )


if __name__ == "__main__":
    main()
