"""Micro-benchmarks that steer the transport (one GPU; needs the cuda-bindings package).

1. Pitched-copy throughput (cudaMemcpy2DAsync) against row width, 256 B .. 16 KB rows, at a
   fixed ~96 MB (Wan 720p's per-rank send), source pitch 8 x width (8 ranks' heads interleaved).
2. The same bytes split into 1..64 copies per call (how many descriptors a call may issue).
3. Host issue cost per copy: cudaMemcpy2DAsync vs cudaMemcpy3DAsync vs cudaMemcpyBatchAsync.

All copies here are same-device, which current drivers run as SM kernels (measured on an H200): these
numbers steer issue strategy and host cost; copy-engine peer bandwidth needs two GPUs.

    python -m fast_ulysses.bench.micro_copy [--json micro_copy.json]
"""

from __future__ import annotations

import argparse
import json

import torch

from fast_ulysses.bench.timing import host_us, median_ms

TOTAL = 96_768_000


def _check(result):
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != 0:
        raise RuntimeError(f"CUDA error {err}")
    return result


def time_ms(fn, iters=20, warmup=3) -> float:
    return median_ms(fn, iters, warmup)


def copy2d(rt, dst, dpitch, src, spitch, width, height, stream):
    _check(
        rt.cudaMemcpy2DAsync(
            dst,
            dpitch,
            src,
            spitch,
            width,
            height,
            rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice,
            stream,
        )
    )


def row_width_sweep(rt, src, dst, stream) -> list[dict]:
    out = []
    for width in (256, 512, 1024, 1280, 2048, 4096, 8192, 16384):
        pitch = 8 * width  # 8 ranks' chunks interleaved in every source row
        height = TOTAL // pitch  # one peer's chunk: TOTAL / 8 bytes
        ms = time_ms(
            lambda: copy2d(rt, dst.data_ptr(), width, src.data_ptr(), pitch, width, height, stream)
        )
        nbytes = width * height
        out.append(
            {
                "row_bytes": width,
                "rows": height,
                "bytes": nbytes,
                "ms": ms,
                "GBps_read_plus_write": 2 * nbytes / ms / 1e6,
            }
        )
    return out


def pieces_sweep(rt, src, dst, stream) -> list[dict]:
    width, pitch = 1280, 10240
    rows = TOTAL // pitch
    out = []
    for pieces in (1, 2, 4, 8, 16, 32, 64):
        per = rows // pieces

        def run():
            for k in range(pieces):
                copy2d(
                    rt,
                    dst.data_ptr() + k * per * width,
                    width,
                    src.data_ptr() + k * per * pitch,
                    pitch,
                    width,
                    per,
                    stream,
                )

        ms = time_ms(run)
        out.append(
            {
                "pieces": pieces,
                "bytes": per * pieces * width,
                "ms": ms,
                "GBps_read_plus_write": 2 * per * pieces * width / ms / 1e6,
            }
        )
    return out


def issue_cost(rt, src, dst, stream, n=2000) -> dict:
    width, pitch, height = 1280, 10240, 64
    results = {}

    def measure(fn):
        return host_us(fn, n)

    results["cudaMemcpy2DAsync_us"] = measure(
        lambda: copy2d(rt, dst.data_ptr(), width, src.data_ptr(), pitch, width, height, stream)
    )
    try:
        p = rt.cudaMemcpy3DParms()
        p.srcPtr = rt.make_cudaPitchedPtr(src.data_ptr(), pitch, width, height)
        p.dstPtr = rt.make_cudaPitchedPtr(dst.data_ptr(), width, width, height)
        p.extent = rt.make_cudaExtent(width, height, 1)
        p.kind = rt.cudaMemcpyKind.cudaMemcpyDeviceToDevice
        results["cudaMemcpy3DAsync_us"] = measure(lambda: _check(rt.cudaMemcpy3DAsync(p, stream)))
    except Exception as error:  # noqa: BLE001 - report, do not invent
        results["cudaMemcpy3DAsync_us"] = f"skipped: {error}"
    results["cudaMemcpyBatchAsync_us"] = batch_cost(rt, src, dst, stream, measure)
    results["note"] = "python binding overhead included; compare the rows with each other"
    return results


def batch_cost(rt, src, dst, stream, measure):
    """cudaMemcpyBatchAsync takes 1D copies only: 8 contiguous pieces per call, per piece."""
    try:
        count, size = 8, 1280 * 64
        dsts = [dst.data_ptr() + i * size for i in range(count)]
        srcs = [src.data_ptr() + i * size for i in range(count)]
        attrs = rt.cudaMemcpyAttributes()
        attrs.srcAccessOrder = rt.cudaMemcpySrcAccessOrder.cudaMemcpySrcAccessOrderStream

        def call():
            return _check(
                rt.cudaMemcpyBatchAsync(dsts, srcs, [size] * count, count, [attrs], [0], 1, stream)
            )

        call()
        return measure(call) / count
    except Exception as error:  # noqa: BLE001
        return f"skipped: {type(error).__name__}: {error}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    args = parser.parse_args()
    try:
        from cuda.bindings import runtime as rt
    except ImportError as error:
        raise SystemExit(
            f"micro_copy needs cuda-bindings (pip install 'fast-ulysses[micro]'): {error}"
        ) from None
    if not torch.cuda.is_available():
        raise SystemExit("micro_copy needs a CUDA GPU: none is visible; nothing measured")
    src = torch.randint(0, 255, (TOTAL,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    # Not torch's default stream: that is the legacy NULL stream (handle 0), which
    # cudaMemcpyBatchAsync refuses with cudaErrorInvalidValue. The timing helpers record their
    # events on the current stream, which this makes the same one.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        results = measure_all(rt, src, dst, side.cuda_stream)
    print_results(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def measure_all(rt, src, dst, stream) -> dict:
    results = {
        "gpu": torch.cuda.get_device_name(),
        "same_device": True,
        "stream": "a non-default torch stream; device times measured behind a spin "
        "kernel (host issue excluded)",
        "row_width": row_width_sweep(rt, src, dst, stream),
        "pieces": pieces_sweep(rt, src, dst, stream),
        "issue_cost": issue_cost(rt, src, dst, stream),
    }
    plain = time_ms(lambda: dst.copy_(src))
    results["plain_1d_copy"] = {
        "bytes": TOTAL,
        "ms": plain,
        "GBps_read_plus_write": 2 * TOTAL / plain / 1e6,
    }
    return results


def print_results(results: dict) -> None:
    print(f"same-device copies on {results['gpu']} (SM kernels, not copy engines)")
    print("row bytes   rows      ms    GB/s (r+w)")
    for r in results["row_width"]:
        print(
            f"{r['row_bytes']:>9} {r['rows']:>7} {r['ms']:>7.3f} {r['GBps_read_plus_write']:>9.0f}"
        )
    print("pieces   ms    GB/s (r+w)   [1280 B rows, 10240 B pitch]")
    for r in results["pieces"]:
        print(f"{r['pieces']:>6} {r['ms']:>6.3f} {r['GBps_read_plus_write']:>9.0f}")
    print(f"plain 1D copy of {TOTAL} B: {results['plain_1d_copy']['ms']:.3f} ms")
    print("host issue cost per copy:", json.dumps(results["issue_cost"]))


if __name__ == "__main__":
    main()
