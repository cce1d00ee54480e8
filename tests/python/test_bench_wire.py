"""The bench's FP8 wire pieces without a GPU: --wire, the wire row (bench/wire.py) on one gloo
CPU rank (the timers, CUDA events and host timing, replaced by ones that run the call once),
its table rows and JSON fields, and the accuracy module (bench/wire_accuracy.py) on tiny
shapes."""

from __future__ import annotations

import argparse
import io
import json

import pytest
import torch
from rich.console import Console

import fast_ulysses as fu
from fast_ulysses.bench import command as bench
from fast_ulysses.bench import report, wire, wire_accuracy
from fast_ulysses.bench.stages import Case


def _parse(*argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_wire_option_defaults_to_no_row_and_takes_the_formats():
    assert _parse().wire is None
    for text, name in (("fp8", "e4m3"), ("e4m3", "e4m3"), ("E5M2", "e5m2"), ("none", None)):
        assert _parse("--wire", text).wire == name
    for bad in ("int8", "", "e4m3fn"):
        with pytest.raises(SystemExit):
            _parse("--wire", bad)
    with pytest.raises(argparse.ArgumentTypeError, match="e4m3, e5m2, fp8"):
        wire.wire_option("bf16")


def _fake_timers(monkeypatch):
    timed = []

    def median(fn, iters, warmup):
        fn()
        timed.append("ms")
        return float(len(timed))

    def host(fn, iters):
        fn()
        timed.append("host")
        return 10.0

    monkeypatch.setattr(wire, "median_ms", median)
    monkeypatch.setattr(wire, "host_us", host)
    return timed


def _ctx(world1, name):
    return argparse.Namespace(fast=fu.TorchUlyssesGroup(world1), wire=name, iters=5, warmup=1)


@pytest.mark.parametrize("name", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("mode", [0, 1])
def test_wire_row_times_both_calls_and_bounds_their_error(world1, monkeypatch, name, dtype, mode):
    timed = _fake_timers(monkeypatch)
    case = Case("t", 2, [6], [3], 16, dtype)
    x = (torch.randn(case.input_shape(0, mode)) * 3).to(dtype)
    ctx = _ctx(world1, name)
    plain = lambda: ctx.fast.all_to_all_single_4d(x, mode, "plain", **case.kwargs())  # noqa: E731
    got = wire.run_wire(case, mode, ctx, x, plain)
    assert got["error"] is None, got
    assert got["format"] == name and timed == ["ms", "ms", "host", "host"]
    assert (got["copy_ms"], got["borrowed_ms"], got["copy_host_us"]) == (1.0, 2.0, 10.0)
    amax = x.float().abs().max().item()
    assert got["input_amax"] == amax
    for call in ("copy", "borrowed"):  # the documented per-row bound, over the whole input
        assert 0 < got[f"{call}_max_abs_error"] <= wire_accuracy.BOUND[name] * amax, got
    assert got["copy_max_abs_error"] == got["borrowed_max_abs_error"]
    assert got["packed_bytes_in"] == x.numel() // 16 * 20  # d + 4 bytes a row


def test_wire_row_error_skips_the_timing(world1, monkeypatch):
    timed = _fake_timers(monkeypatch)
    case = Case("t", 1, [4], [2], 8, torch.float64)  # a wire call takes bf16, fp16, fp32
    x = torch.randn(case.input_shape(0, 0), dtype=torch.float64)
    ctx = _ctx(world1, "e4m3")
    got = wire.run_wire(case, 0, ctx, x, lambda: x)  # (the group's plain call refuses 8 bytes)
    assert got["error"].startswith("rank 0: FastUlyssesError: x has dtype torch.float64"), got
    assert got["copy_ms"] is None and timed == []


def _wire_result(**kw):
    w = {
        "format": "e4m3",
        "copy_ms": 0.6,
        "borrowed_ms": 0.5,
        "copy_host_us": 50.0,
        "borrowed_host_us": 40.0,
        "copy_max_abs_error": 0.25,
        "borrowed_max_abs_error": 0.25,
        "input_amax": 8.0,
        "packed_bytes_in": 660,
        "error": None,
    }
    w.update(kw)
    r = {
        "bytes_in": 1_200_000_000,
        "fast_copy_ms": 0.5,
        "fast_borrowed_ms": 0.4,
        "own_share_ms": 0.05,
        "fast_copy_host_us": 40.0,
        "fast_borrowed_host_us": 30.0,
        "wire": w,
    }
    results = {
        "machine": {"gpu": "test", "world_size": 2, "shared_gpu": True},
        "cases": [{"case": "wan-720p", "mode": 0, "result": r}],
        "baseline_note": "n/a",
        "padding": [],
    }
    return {row[1]: row[2:] for row in report.wire_rows("wan-720p m0", w, r)}, results


def test_wire_rows_give_time_ratio_host_and_error():
    rows, _ = _wire_result()
    name = "FP8 wire e4m3 {} (quantize + a2a + dequantize), max |err| 0.25 (0.0312 of amax)"
    assert rows[name.format("copy")] == ["0.600", "2000.0", "1.20x plain's time", "50.0"]
    assert rows[name.format("borrowed")] == ["0.500", "2400.0", "1.25x plain's time", "40.0"]
    rows, _ = _wire_result(copy_ms=None, borrowed_ms=None, error="rank 1: RuntimeError: boom")
    assert rows == {"FP8 wire e4m3": ["n/a: rank 1: RuntimeError: boom", "", "", ""]}
    assert report.wire_rows("x", None, {}) == []


def test_table_json_and_slowest_carry_the_wire_row(tmp_path):
    _, results = _wire_result()
    buffer = io.StringIO()
    report.print_table(results, Console(file=buffer, width=250))
    assert "FP8 wire e4m3 copy (quantize + a2a + dequantize), max |err| 0.25" in buffer.getvalue()
    path = report.write_json(results, tmp_path, "t")
    saved = json.loads(path.read_text())["cases"][0]["result"]["wire"]
    assert saved["copy_max_abs_error"] == 0.25 and saved["format"] == "e4m3"
    w = results["cases"][0]["result"]["wire"]
    merged = report.slowest([{"wire": w}, {"wire": dict(w, copy_ms=0.9, copy_max_abs_error=0.5)}])
    assert merged["wire"]["copy_ms"] == 0.9 and merged["wire"]["copy_max_abs_error"] == 0.5
    assert merged["wire"]["format"] == "e4m3" and merged["wire"]["error"] is None


# -- the accuracy module -------------------------------------------------------------------


def test_half_steps_and_ceilings_are_the_formats():
    assert wire_accuracy.half_step("e4m3") == 16 / 448
    assert wire_accuracy.half_step("e5m2") == 4096 / 57344
    assert wire_accuracy.ceiling("e4m3", torch.bfloat16) == 16 / 448 + 2**-8
    for name in wire_accuracy.FORMATS:  # the ceiling under the documented bound
        assert wire_accuracy.ceiling(name, torch.bfloat16) < wire_accuracy.BOUND[name]


def test_qkv_like_has_the_shape_scales_and_outliers():
    t = wire_accuracy.qkv_like(heads=3, tokens=64, d=32, seed=0)
    assert sorted(t) == ["k", "q", "v"]
    assert all(x.shape == (1, 64, 3, 32) and x.dtype == torch.bfloat16 for x in t.values())
    # q's outlier channels: per head, the top OUTLIERS channels' RMS far above the rest's
    rms = t["q"].float().square().mean(dim=(0, 1)).sqrt()  # (heads, d)
    top = rms.topk(wire_accuracy.OUTLIERS, dim=-1).values.min(-1).values
    assert (top > 4 * rms.median(-1).values).all()
    assert torch.equal(wire_accuracy.qkv_like(3, 64, 32, 0)["v"], t["v"])  # seeded


def test_element_table_stays_under_each_ceiling():
    records = wire_accuracy.element_table(tokens=8, seed=0)
    assert len(records) == 2 * (1 + 3 * len(wire_accuracy.MODELS))
    for r in records:
        assert 0 < r["max_rel_row"] <= r["ceiling"] and r["within_bound"], r
        assert r["mean_rel_row"] <= r["max_rel_row"] and r["snr_db"] > 20, r
    heads = {r["data"]: r["shape"][2] for r in records}
    assert heads == {"random": 40, "wan-14b": 40, "wan-1.3b": 12, "hunyuan": 24}
    lines = wire_accuracy.element_lines(records)
    assert lines[0].split()[:4] == ["data", "tensor", "format", "max"]
    assert len(lines) == 1 + len(records)


def test_round_trip_is_exact_on_zero_rows_and_bounded_otherwise():
    x = torch.randn(5, 16).bfloat16()
    x[2] = 0
    y = wire_accuracy.round_trip(x, torch.float8_e4m3fn)
    assert y.dtype == torch.bfloat16 and torch.equal(y[2], x[2])
    assert wire_accuracy.element_errors(x, "e4m3")["within_bound"]


def test_output_errors_give_max_mean_and_psnr():
    want = torch.tensor([[1.0, -2.0, 0.5, 0.0]])
    e = wire_accuracy.output_errors(want + torch.tensor([[0.1, 0.0, -0.1, 0.0]]), want)
    assert e["max_abs"] == pytest.approx(0.1) and e["mean_abs"] == pytest.approx(0.05)
    assert e["psnr_db"] == pytest.approx(20 * torch.log10(torch.tensor(2.0 / 0.005**0.5)).item())
    assert wire_accuracy.output_errors(want, want)["psnr_db"] == float("inf")


def test_main_writes_the_table_and_json_without_the_block(tmp_path, capsys):
    assert wire_accuracy.main(["--out-dir", str(tmp_path), "--tokens", "4", "--nproc", "0"]) == 0
    out = capsys.readouterr().out
    assert "hunyuan" in out and "results: " in out
    (path,) = tmp_path.glob("*-cpu-wire-accuracy.json")
    saved = json.loads(path.read_text())
    assert saved["machine"]["device"] == "cpu" and "block" not in saved
    assert saved["distribution"].startswith("synthetic") and saved["args"]["tokens"] == 4


def test_the_wan_block_runs_on_two_gloo_ranks():
    """A tiny Wan attention block (2 heads of 128, 16 tokens) on 2 ranks: the plain bf16 run
    near one fp32 process, and each FP8 format further from it than bf16 is."""
    pytest.importorskip("diffusers")
    block = wire_accuracy.run_block(dict(heads=2, frames=1, size=8, seed=0), 2)
    assert (block["tokens"], block["world_size"], block["head_dim"]) == (16, 2, 128)
    by = {r["output"]: r for r in block["records"]}
    assert sorted(by) == ["bf16", "e4m3", "e5m2"] and "vs_bf16" not in by["bf16"]
    assert by["bf16"]["vs_fp32"]["psnr_db"] > 45
    for name in ("e4m3", "e5m2"):
        e = by[name]["vs_bf16"]
        assert 0 < e["max_abs"] < 0.1 * e["max_abs_reference"], e
        assert 25 < e["psnr_db"] < by["bf16"]["vs_fp32"]["psnr_db"], e
    lines = wire_accuracy.block_lines(block)
    assert "2 heads x 128, 16 tokens, 2 ranks" in lines[0] and len(lines) == 2 + 5


def test_wire_passes_times_both_routes_on_the_cpu(tmp_path, capsys):
    """bench/wire_passes.py on a tiny slice (--p 7560: 10 tokens), one round: the op and the
    torch reference of each pass both timed (the CPU has the ops' kernels), printed and saved."""
    from fast_ulysses.bench import wire_passes

    path = tmp_path / "passes.json"
    wire_passes.main(["--device", "cpu", "--p", "7560", "--rounds", "1", "--repeats", "1",
                      "--json", str(path)])  # fmt: skip
    saved = json.loads(path.read_text())
    assert saved["shape"] == [1, 10, 40, 128] and saved["device"] == "cpu"
    routes = saved["ms_per_pass_by_round"]
    assert sorted(routes) == [
        "dequantize, op",
        "dequantize, torch reference",
        "quantize, op",
        "quantize, torch reference",
    ]
    assert all(len(v) == 1 and v[0] > 0 for v in routes.values()), routes
    assert "quantize, op" in capsys.readouterr().out
