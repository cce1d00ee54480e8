"""The benchmark's GPU-free parts: presets, cases, the baseline's relayout (on gloo, CPU),
the table / JSON / plot writers, and the no-GPU exit."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fast_ulysses as fu
from fast_ulysses.bench import command as bench
from fast_ulysses.bench import report
from fast_ulysses.bench.stages import Baseline, Case
from fast_ulysses.presets import PRESETS, even_splits, preset_call


def test_presets_and_splits():
    assert PRESETS["wan-720p"].seq_len == 75_600 and PRESETS["hunyuan-720p"].heads == 24
    assert even_splits(12, 8) == [2, 2, 2, 2, 1, 1, 1, 1]
    call = preset_call("wan-1.3b-720p", 8, 7)
    assert call["shape"] == (1, 9450, 12, 128) and call["head_splits"] == even_splits(12, 8)
    assert preset_call("wan-720p", 8, 0)["head_splits"] is None


def test_a_preset_checks_the_world_size_before_splitting():
    """The plan's range comes first: a huge world size is the plan's ValueError at once, not a
    list of a billion splits."""
    for world_size in (0, 1_000_000_000):
        with pytest.raises(ValueError, match="world_size"):
            preset_call("wan-720p", world_size, 0)


def _args(**kw):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args([f"--{k.replace('_', '-')}={v}" for k, v in kw.items()])


def test_cases_add_a_padded_twin_only_when_needed():
    names = [c.name for c in bench.cases(_args(preset="hunyuan-720p", text_tokens=256), 5)]
    assert names == ["hunyuan-720p", "hunyuan-720p-padded"]
    padded = bench.cases(_args(preset="hunyuan-720p", text_tokens=256), 5)[1]
    assert sum(padded.seq_splits) == 119_060 and len(set(padded.seq_splits)) == 1
    assert [c.name for c in bench.cases(_args(preset="wan-720p"), 8)] == ["wan-720p"]


def _baseline_worker(rank, world_size, store, case, result_dir):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    for mode in (0, 1):
        xs = []
        for r in range(world_size):
            shape = case.input_shape(r, mode)
            xs.append(
                torch.randn(shape, generator=torch.Generator().manual_seed(r + 10 * mode)).to(
                    case.dtype
                )
            )
        got = Baseline(dist.group.WORLD, case, mode, rank).full(xs[rank])
        want = fu.simulate(xs, mode, **case.kwargs())[rank]
        assert torch.equal(got, want), (rank, mode)
    dist.destroy_process_group()


def test_baseline_relayout_is_bit_exact_with_simulate():
    case = Case("t", 2, [3, 0, 5], [2, 1, 2], 16, torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_baseline_worker, args=(3, os.path.join(tmp, "s"), case, tmp), nprocs=3)


def synthetic_results(with_baseline=True):
    r = {
        "bytes_in": 96_768_000,
        "fast_copy_ms": 0.5,
        "fast_borrowed_ms": 0.4,
        "own_share_ms": 0.05,
        "fast_copy_host_us": 40.0,
        "fast_borrowed_host_us": 30.0,
        "fast_overlap": {"gemm_ms": 10, "collective_ms": 0.5, "both_ms": 10.1, "hidden": 0.8},
    }
    if with_baseline:
        r.update(
            baseline_ms=1.2,
            permute_in_ms=0.2,
            raw_a2a_ms=0.8,
            permute_out_ms=0.2,
            baseline_host_us=60.0,
            baseline_matches_fast=True,
        )
    return {
        "machine": {"gpu": "test", "world_size": 8, "shared_gpu": not with_baseline},
        "cases": [{"case": "wan-720p", "mode": 0, "result": r}],
        "baseline_note": "" if with_baseline else "n/a: NCCL cannot run",
        "padding": [],
    }


@pytest.mark.parametrize("with_baseline", [True, False])
def test_table_json_plot(tmp_path, with_baseline):
    results = synthetic_results(with_baseline)
    import io

    from rich.console import Console

    buffer = io.StringIO()
    report.print_table(results, Console(file=buffer, width=200))
    table = buffer.getvalue()
    assert "fast-ulysses copy" in table
    assert ("2.40x" in table) == with_baseline  # 1.2 ms baseline / 0.5 ms fast
    if not with_baseline:
        assert "n/a" in table and "not NVLink numbers" in table
    path = report.write_json(results, tmp_path, "t")
    assert json.loads(path.read_text())["machine"]["gpu"] == "test"
    png = report.write_plot(results, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_slowest_takes_the_max_and_least_hidden():
    a = {"x": 1.0, "ok": True, "o": {"gemm_ms": 1, "collective_ms": 2, "both_ms": 2, "hidden": 0.9}}
    b = {
        "x": 3.0,
        "ok": False,
        "o": {"gemm_ms": 2, "collective_ms": 1, "both_ms": 2, "hidden": 0.5},
    }
    s = report.slowest([a, b])
    assert s["x"] == 3.0 and s["ok"] is False and s["o"]["hidden"] == 0.5


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
@pytest.mark.parametrize(
    "command",
    [["fast_ulysses.cli.main", "bench"], ["fast_ulysses.bench"]],
    ids=["fast-ulysses bench", "python -m fast_ulysses.bench"],
)
def test_bench_without_gpu_says_so(command):
    result = subprocess.run(
        [sys.executable, "-m", *command], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2
    assert "no CUDA GPU visible" in result.stderr and "Traceback" not in result.stderr


def test_padding_notes_name_the_twin_or_say_not_applicable():
    notes = bench.padding_notes(bench.cases(_args(preset="hunyuan-720p", text_tokens=256), 5), 5)
    assert len(notes) == 1 and "hunyuan-720p-padded" in notes[0] and "119060" in notes[0]
    notes = bench.padding_notes(bench.cases(_args(preset="wan-720p"), 8), 8)
    assert notes == ["wan-720p: not applicable (sequence 75600 is a multiple of P=8)"]


def test_hold_covers_the_host_issue_and_is_capped():
    from fast_ulysses.bench.timing import MAX_HOLD_MS, hold_ms

    assert hold_ms(0.1, 50) >= 0.1 * 50 and hold_ms(0.0, 50) > 0
    assert hold_ms(100.0, 50) == MAX_HOLD_MS


def test_negative_or_missing_hidden_is_reported_not_clipped():
    results = synthetic_results()
    results["cases"][0]["result"]["fast_overlap"]["hidden"] = -0.4
    results["cases"][0]["result"]["baseline_overlap"] = {
        "gemm_ms": 1,
        "collective_ms": 0,
        "both_ms": 1,
        "hidden": None,
    }
    text = "\n".join(" ".join(row) for row in report.rows(results))
    assert "-40% hidden" in text and "n/a hidden" in text
    s = report.slowest(
        [{"o": {"hidden": None, "both_ms": None}}, {"o": {"hidden": 0.3, "both_ms": 2}}]
    )
    assert s["o"] == {"hidden": 0.3, "both_ms": 2}


def _micro_copy():
    from fast_ulysses.bench import micro_copy

    return micro_copy


@pytest.mark.parametrize("module", ["quick_wan", "micro_copy", "fallback_check_cost"])
def test_each_benchmark_runs_as_a_module(module):
    """Every standalone benchmark is a module of the installed package: `python -m
    fast_ulysses.bench.<module> --help` imports it and prints its options (no GPU needed)."""
    result = subprocess.run(
        [sys.executable, "-m", f"fast_ulysses.bench.{module}", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, (module, result.stderr)
    assert "--json" in result.stdout and "Traceback" not in result.stderr, result.stdout


@pytest.mark.skipif(torch.cuda.is_available(), reason="fake pointers: only without a driver")
def test_micro_copy_batch_call_matches_the_binding():
    """The cudaMemcpyBatchAsync call marshals (no TypeError) with the installed cuda-bindings;
    without a driver it is refused with a CUDA error, which is reported, not raised."""
    rt = pytest.importorskip("cuda.bindings.runtime")
    fake = argparse.Namespace(data_ptr=lambda: 1 << 20)
    result = _micro_copy().batch_cost(rt, fake, fake, 12345, lambda call: 0.0)
    assert not (isinstance(result, str) and "TypeError" in result), result


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU path")
def test_micro_copy_without_gpu_says_so():
    result = subprocess.run(
        [sys.executable, "-m", "fast_ulysses.bench.micro_copy"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "needs a CUDA GPU" in result.stderr
    assert "Traceback" not in result.stderr


def test_median_ms_holds_the_device_before_the_timed_calls(monkeypatch):
    """The call sequence of median_ms with torch.cuda faked: warmup + 3 issue-timing + iters
    calls (the same on every rank), and the spin queued after those 3 and before the timed ones."""
    from fast_ulysses.bench import timing

    log = []

    class Event:
        def __init__(self, enable_timing=False):
            self.t = 0.0

        def record(self):
            log.append("record")

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return 2.0

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: log.append("sync"))
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: log.append(("sleep", cycles)))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(timing, "_cycles_per_ms", {})
    assert timing.median_ms(lambda: log.append("fn"), iters=4, warmup=2) == 2.0
    assert log.count("fn") == 2 + 3 + 4
    last_sleep = max(i for i, e in enumerate(log) if isinstance(e, tuple))
    assert log[last_sleep + 1 :].count("fn") == 4 and "fn" not in log[last_sleep - 2 : last_sleep]


def test_chain_length_and_gemm_shrinking():
    from fast_ulysses.bench.timing import MIN_GEMM_SIZE, chain_length, smaller_gemm

    assert chain_length(0.3, 0.9) == 3 and chain_length(0.2, 0.9) == 5  # >= the collective
    assert chain_length(0.025, 0.24) == 10 and chain_length(0.1, 0.301) == 4
    assert chain_length(12.6, 0.24) == 1 and chain_length(0.0, 1.0) == 1  # never an empty chain
    assert smaller_gemm(8192, 1.6, 0.24) == 4096  # one GEMM ~7x the collective: halve
    assert smaller_gemm(4096, 0.2, 0.24) == 2048  # more than half of it: halve
    assert smaller_gemm(2048, 0.025, 0.24) is None  # a chain of 10 fits
    assert smaller_gemm(MIN_GEMM_SIZE, 1.0, 0.001) is None


def test_fit_chain_halves_until_one_gemm_fits_then_counts(monkeypatch):
    """The chain for a 0.24 ms collective (the P = 1 case that printed 264% hidden beside a
    12.6 ms chain), with one GEMM faked as 1.6 ms at 8192 and cubic in the size."""
    from fast_ulysses.bench import stages

    sizes = []
    monkeypatch.setattr(
        stages, "gemm_chain", lambda device, size, count: (sizes.append(size), size)[1]
    )
    monkeypatch.setattr(stages, "median_ms", lambda size, it, wu: 1.6 * (size / 8192) ** 3)
    assert stages.fit_chain("cpu", 8192, 0.24, 5, 2) == (2048, 10)  # 10 x 0.025 ms
    assert sizes == [8192, 4096, 2048]
    assert stages.fit_chain("cpu", 8192, 0.9, 5, 2) == (4096, 5)  # 5 x 0.2 ms >= 0.9 ms
    assert stages.fit_chain("cpu", 8192, 12.6, 5, 2) == (8192, 8)  # 8 x 1.6 ms >= 12.6 ms
    assert stages.fit_chain("cpu", 256, 1e-6, 5, 2) == (128, 1)  # the smallest size, once


def test_measure_overlap_sizes_the_chain_to_the_collective(monkeypatch):
    from fast_ulysses.bench import stages

    ctx = argparse.Namespace(
        iters=40, device="cpu", gemm_size=8192, gemms="auto", overlap_repeats=3
    )
    calls = {}
    monkeypatch.setattr(stages, "on_side", lambda fn: "coll-on-side")
    monkeypatch.setattr(stages, "median_ms", lambda fn, it, wu: 0.3)
    monkeypatch.setattr(stages, "fit_chain", lambda device, size, target, it, wu: (2048, 3))
    monkeypatch.setattr(stages, "gemm_chain", lambda device, size, count: ("chain", size, count))

    def fake_overlap(gemms, collective, it, wu, repeats):
        calls.update(gemms=gemms, it=it, repeats=repeats)
        return {"hidden": 0.5}

    monkeypatch.setattr(stages, "overlap", fake_overlap)
    o = stages.measure_overlap(ctx, lambda: None)
    assert o == {"hidden": 0.5, "gemm_size": 2048, "gemms": 3, "target_ms": 0.3}
    assert calls == {"gemms": ("chain", 2048, 3), "it": 10, "repeats": 3}
    ctx.gemms = 8  # a fixed count: no calibration of the chain
    assert stages.measure_overlap(ctx, lambda: None)["gemms"] == 8
    assert calls["gemms"] == ("chain", 8192, 8)


def test_overlap_summary_is_the_median_and_spread_of_hidden():
    from fast_ulysses.bench.timing import spread, summarize_overlap

    assert spread([3.0, None, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0}
    assert spread([None]) == {"median": None, "min": None, "max": None}
    runs = [
        {"gemm_ms": g, "collective_ms": c, "both_ms": b, "hidden": (g + c - b) / c}
        for g, c, b in ((0.30, 0.25, 0.40), (0.32, 0.24, 0.50), (0.29, 0.26, 0.31))
    ]
    s = summarize_overlap(runs)
    assert s["hidden"] == pytest.approx(0.6) and s["hidden_min"] == pytest.approx(0.25)
    assert s["hidden_max"] == pytest.approx(0.24 / 0.26)
    assert (s["gemm_ms"], s["collective_ms"], s["both_ms"]) == (0.30, 0.25, 0.40)
    assert s["runs"] == runs


def _graph_results(error=None):
    results = synthetic_results()
    r = results["cases"][0]["result"]
    r["graph_copy"] = {"ms": 0.25, "host_us": 8.0, "error": None}
    r["graph_borrowed"] = (
        {"ms": None, "host_us": None, "error": error}
        if error
        else {"ms": 0.2, "host_us": 6.5, "error": None}
    )
    r["fast_overlap"] = {
        "gemm_ms": 0.26,
        "collective_ms": 0.24,
        "both_ms": 0.35,
        "hidden": 0.625,
        "hidden_min": 0.5,
        "hidden_max": 0.75,
        "runs": [{}] * 5,
        "gemm_size": 4096,
        "gemms": 1,
        "target_ms": 0.24,
    }
    return results


def test_table_and_json_carry_the_graph_rows_and_overlap_spread(tmp_path):
    table = {row[1]: row for row in report.rows(_graph_results())}
    assert table["graph copy"][2:] == ["0.250", "387.1", "4.80x", "8.0"]  # 1.2 / 0.25
    assert table["graph borrowed"][2:] == ["0.200", "483.8", "6.00x", "6.5"]
    assert table["overlap fast copy"][2] == (
        "62% hidden [50%, 75% over 5] (chain: 1 x 4096 GEMMs 0.260 ms, coll 0.240, both 0.350)"
    )
    saved = json.loads(report.write_json(_graph_results(), tmp_path, "g").read_text())
    assert saved["cases"][0]["result"]["graph_borrowed"]["ms"] == 0.2
    assert saved["cases"][0]["result"]["fast_overlap"]["hidden_max"] == 0.75


def test_a_capture_error_is_a_row_not_a_crash(tmp_path):
    error = "rank 3: RuntimeError: " + "operation not permitted when stream is capturing " * 9
    results = _graph_results(error)
    table = {row[1]: row for row in report.rows(results)}
    assert table["graph borrowed"][2] == "n/a: " + error[: report.ERROR_CHARS]
    assert table["graph copy"][2] == "0.250"
    saved = json.loads(report.write_json(results, tmp_path, "e").read_text())
    assert saved["cases"][0]["result"]["graph_borrowed"]["error"] == error
    import io

    from rich.console import Console

    report.print_table(results, Console(file=io.StringIO(), width=200))


def test_slowest_keeps_an_overlap_record_whole_and_the_agreed_error():
    def o(hidden, top):
        return {
            "hidden": hidden,
            "hidden_min": hidden and hidden - 0.1,
            "hidden_max": top,
            "gemms": 2,
        }

    a = {"o": o(0.8, 0.95), "g": {"ms": None, "error": "rank 1: boom"}}
    b = {"o": o(0.4, 1.9), "g": {"ms": None, "error": "rank 1: boom"}}
    s = report.slowest([a, b])
    assert s["o"] == o(0.4, 1.9)  # the least hidden rank's spread, not a max across ranks
    assert s["g"] == {"ms": None, "error": "rank 1: boom"}
    assert report.slowest([{"o": o(None, None)}, {"o": o(None, None)}])["o"]["gemms"] == 2


def test_first_error_names_the_first_failing_rank():
    from fast_ulysses.bench.timing import first_error

    assert first_error([None, None]) is None
    assert first_error([None, "ValueError: x", "RuntimeError: y"]) == "rank 1: ValueError: x"


def test_graph_timing_records_a_capture_error_or_times_replays(world1, monkeypatch):
    from fast_ulysses.bench import stages

    def broken(fn):
        raise RuntimeError("capture invalidated")

    monkeypatch.setattr(stages, "capture", broken)
    assert stages.graph_timing(lambda: None, 5, 1) == {
        "ms": None,
        "host_us": None,
        "error": "rank 0: RuntimeError: capture invalidated",
    }

    log = []
    graph = argparse.Namespace(
        replay=lambda: log.append("replay"), reset=lambda: log.append("reset")
    )
    monkeypatch.setattr(stages, "capture", lambda fn: graph)
    monkeypatch.setattr(stages, "median_ms", lambda fn, it, wu: (fn(), 0.125)[1])
    monkeypatch.setattr(stages, "host_us", lambda fn, it: (fn(), 7.5)[1])
    assert stages.graph_timing(lambda: None, 5, 1) == {"ms": 0.125, "host_us": 7.5, "error": None}
    assert log == ["replay", "replay", "reset"]


def test_bench_cli_flags_and_defaults_in_help():
    args = _args()
    assert (args.gemms, args.overlap_repeats, args.graph) == ("auto", 5, False)
    assert _args(gemms=0).gemms == 0 and _args(gemms=3).gemms == 3
    parser = argparse.ArgumentParser(formatter_class=bench.HelpFormatter)
    bench.add_arguments(parser)
    assert parser.parse_args(["--graph", "--overlap-repeats", "7"]).overlap_repeats == 7
    with pytest.raises(SystemExit):
        parser.parse_args(["--gemms", "-1"])
    text = " ".join(parser.format_help().split())
    for default in (
        "(default: auto)",
        "(default: 5)",
        "(default: 8192)",
        "(default: 50)",
        "(default: 0)",
        "(default: fast-ulysses-results)",
    ):
        assert default in text, default
    assert "(default: None)" not in text and "(default: False)" not in text


def test_fused_rows_give_time_bandwidth_and_cost_against_the_plain_call():
    results = _graph_results()
    r = results["cases"][0]["result"]
    r["fused"] = {
        "norm": "all_heads",
        "rope_style": "interleaved",
        "fused_ms": 0.25,
        "unfused_ms": 0.75,
        "plain_borrowed_ms": 0.2,
        "fused_host_us": 9.0,
        "bytes_moved": 2 * r["bytes_in"],
    }
    table = {row[1]: row for row in report.rows(results)}
    fused = table["fused norm + RoPE scatter (all_heads, interleaved; GB/s: read + write)"]
    assert fused[2:] == [
        "0.250",
        f"{2 * r['bytes_in'] / 0.25 / 1e6:.1f}",
        "1.25x plain's time",
        "9.0",
    ]
    assert table["  unfused: torch norm + RoPE, then borrowed"][4] == "3.75x plain's time"
    assert table["  plain borrowed (no norm, no RoPE)"][4] == "1.00x plain's time"


def test_fused_style_follows_the_model():
    from fast_ulysses.bench.stages import Case, fused_style

    wan = Case("wan-720p", 1, [1], [1], 128, torch.bfloat16)
    hunyuan = Case("hunyuan-720p", 1, [1], [1], 128, torch.bfloat16)
    assert fused_style(wan) == ("all_heads", "interleaved")
    assert fused_style(hunyuan) == ("per_head", "half")


def test_transfer_row_is_over_peer_bytes_and_not_applicable_at_one_rank():
    results = synthetic_results()
    r = results["cases"][0]["result"]
    r["peer_bytes"] = r["bytes_in"] * 7 // 8
    transfer = "  transfer = copy - own share (derived)"
    ms = max(r["fast_copy_ms"] - r["own_share_ms"], 0.0)
    row = {row[1]: row for row in report.rows(results)}[transfer]
    assert row[2:4] == [f"{ms:.3f}", f"{r['peer_bytes'] / ms / 1e6:.1f}"], row
    results["machine"]["world_size"] = 1  # nothing moves: no figure, not noise over zero bytes
    row = {row[1]: row for row in report.rows(results)}[transfer]
    assert row[2:] == ["n/a: no peers at P = 1", "n/a", "n/a", "n/a"], row


def test_own_share_bytes_are_this_ranks_chunk():
    from fast_ulysses.bench.stages import own_share_bytes

    case = Case("t", 1, [3, 5], [2, 4], 16, torch.bfloat16)
    x0 = torch.empty(case.input_shape(1, 0), dtype=torch.bfloat16)  # (1, 5, 6, 16)
    assert own_share_bytes(case, 0, 1, x0) == 1 * 5 * 4 * 16 * 2
    x1 = torch.empty(case.input_shape(1, 1), dtype=torch.bfloat16)  # (1, 8, 4, 16)
    assert own_share_bytes(case, 1, 1, x1) == 1 * 5 * 4 * 16 * 2


BEYOND = "is beyond int64: it must be in [-2^63, 2^63 - 1]"


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--shape", "a,b"], "argument --shape: 'a,b': 'a' is not an integer"),
        (["--shape", "1,2,3"], "argument --shape: '1,2,3': it must be 4 comma-separated integers"),
        (
            ["--shape", "1,0,4,8"],
            "argument --shape: '1,0,4,8': it must be 4 comma-separated integers",
        ),
        (["--shape", f"1,2,3,{2**63}"], f"argument --shape: '1,2,3,{2**63}': '{2**63}' {BEYOND}"),
        (["--iters", "0"], "argument --iters: '0' is out of range: it must be >= 1 (e.g. 50)"),
        (["--iters", "2.5"], "argument --iters: '2.5' is not an integer (e.g. 50)"),
        (["--warmup", "-1"], "argument --warmup: '-1' is out of range: it must be >= 0"),
        (["--warmup", str(2**63)], f"argument --warmup: '{2**63}' {BEYOND}"),
        (["--text-tokens", "-1"], "argument --text-tokens: '-1' is out of range: it must be >= 0"),
        (["--gemm-size", "0"], "argument --gemm-size: '0' is out of range: it must be >= 1"),
        (["--gemms", "x"], "argument --gemms: 'x' is not an integer (e.g. 4 or auto)"),
        (["--gemms", str(2**64)], f"argument --gemms: '{2**64}' {BEYOND}"),
        (["--overlap-repeats", "0"], "argument --overlap-repeats: '0' is out of range"),
        (["--nproc", "0"], "argument --nproc: '0' is out of range: it must be in [1, 8]"),
        (["--nproc", "9"], "argument --nproc: '9' is out of range: it must be in [1, 8]"),
        (
            ["--nproc", str(2**63)],
            f"argument --nproc: '{2**63}' is out of range: it must be in [1, 8]",
        ),
        (["--modes", "0,2"], "argument --modes: '0,2': every mode must be 0 or 1"),
        (["--modes", "x"], "argument --modes: 'x': 'x' is not an integer"),
        (
            ["--shape", "1,1000000000,1000000,128"],
            "--shape 1,1000000000,1000000,128 on 8 ranks, mode 0: tensor of 1.28e+17 bytes: larger "
            "than the 2^50-byte limit",
        ),
        (
            ["--preset", "wan-720p", "--text-tokens", str(2**63 - 1)],
            f"--preset wan-720p with --text-tokens {2**63 - 1} on 8 ranks, mode 0: ",
        ),
    ],
)
def test_bench_checks_every_argument_before_the_gpu(capsys, argv, message):
    """A bad argument is one usage line naming it (exit 2), on any machine: no "no CUDA GPU",
    no traceback, no rank spawned."""
    try:
        code = bench.main(argv)
    except SystemExit as stop:  # argparse's usage error
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert line.startswith("fast-ulysses bench: error: "), err
    assert message in line, (message, line)
    assert "no CUDA GPU" not in err and "Traceback" not in err


def test_bench_check_plans_every_case():
    """Every preset and a valid --shape check clean; one tensor past the plan's limit, and the
    padded twin of a sequence the ranks do not divide, are named as the case they come from."""
    assert bench.check(_args(shape="1,100,12,128", nproc=4), 4) == ""
    assert bench.check(_args(), 8) == ""
    assert bench.check(_args(shape="1,1073741824,4096,128"), 2) == ""  # 2^50 bytes: the limit
    assert bench.check(_args(shape="1,1073741825,4096,128"), 2).startswith(
        "--shape 1,1073741825,4096,128 on 2 ranks, mode 0: tensor of "
    )
    rows = 2**50 // (3 * 128 * 2)  # the most rows of 3 heads that fit, not a multiple of 8
    problem = bench.check(_args(shape=f"1,{rows},3,128"), 8)
    assert problem.startswith(f"--shape 1,{rows},3,128 (padded) on 8 ranks, mode 0: tensor of ")


@pytest.mark.parametrize(
    "world_size,rank,message",
    [
        (2**63, 0, f"world_size is {2**63}: it must fit in int64"),
        (8, 2.0, "rank is 2.0: it must be an int (e.g. 2)"),
        (True, 0, "world_size is True: it must be an int, not a bool"),
        (9, 0, "world_size=9: must be in [1, 8]"),
        (8, -1, "rank=-1: must be in [0, world_size=8)"),
    ],
)
def test_a_preset_refuses_what_the_plan_refuses_by_name(world_size, rank, message):
    with pytest.raises(fu.errors.FastUlyssesError) as info:
        preset_call("wan-720p", world_size, rank)
    assert str(info.value).startswith(message), str(info.value)


def test_attention_rows_give_both_times_and_the_pipelined_cost():
    results = synthetic_results()
    r = results["cases"][0]["result"]
    r["attention"] = {
        "pipeline": 4,
        "plain_ms": 20.0,
        "pipelined_ms": 17.0,
        "max_abs_diff": 0.0,
        "error": None,
    }
    table = {row[1]: row for row in report.rows(results)}
    assert table["UlyssesAttention pipeline=1 (forward, no grad)"][2:] == [
        "20.000",
        "n/a",
        "1.00x plain's time",
        "n/a",
    ]
    assert table["UlyssesAttention pipeline=4 (forward, no grad), max |diff| 0"][2:] == [
        "17.000",
        "n/a",
        "0.85x plain's time",
        "n/a",
    ]
    r["attention"] = {
        "pipeline": 9,
        "plain_ms": None,
        "pipelined_ms": None,
        "max_abs_diff": None,
        "error": "rank 0: FastUlyssesError: pipeline is 9",
    }
    table = {row[1]: row for row in report.rows(results)}
    assert (
        table["UlyssesAttention pipeline=9 (forward, no grad)"][2]
        == "n/a: rank 0: FastUlyssesError: pipeline is 9"
    )


def test_attention_row_runs_on_cpu_ranks(world1, monkeypatch):
    """The attention stage end to end on a one-rank gloo group (TorchUlyssesGroup, CPU): both
    modules run, their outputs agree bit for bit, and each is handed to the timer (CUDA events
    need a GPU: the timer is replaced by one that runs the call once); a G the module refuses
    is the row's error on every rank, and nothing is timed."""
    from fast_ulysses.bench import attention

    timed = []
    monkeypatch.setattr(
        attention, "median_ms", lambda fn, it, wu: (timed.append(fn().shape), 1.5 + len(timed))[1]
    )
    case = Case("t", 1, [12], [6], 16, torch.float32)
    x = torch.randn(case.input_shape(0, 0))
    ctx = argparse.Namespace(fast=fu.TorchUlyssesGroup(world1), pipeline=3, iters=50, warmup=10)
    got = attention.run_attention(case, ctx, x)
    assert got == {
        "pipeline": 3,
        "plain_ms": 2.5,
        "pipelined_ms": 3.5,
        "max_abs_diff": 0.0,
        "error": None,
    }, got
    assert timed == [x.shape, x.shape]
    ctx.pipeline = 7
    got = attention.run_attention(case, ctx, x)
    assert got["plain_ms"] is None and got["pipelined_ms"] is None and len(timed) == 2
    assert got["error"].startswith(
        "rank 0: FastUlyssesError: pipeline is 7 but no rank holds more than 6 q heads"
    ), got


def test_bench_checks_the_pipeline_against_the_heads():
    problem = bench.check(_args(preset="wan-720p", pipeline=6, nproc=8), 8)
    assert problem.startswith(
        "--preset wan-720p on 8 ranks, --pipeline 6: pipeline is 6 but no "
        "rank holds more than 5 q heads"
    ), problem
    assert bench.check(_args(preset="wan-720p", pipeline=5, nproc=8), 8) == ""
    assert bench.check(_args(preset="wan-720p", pipeline=6, nproc=8, modes="1"), 8) == ""


def _bench_imports() -> dict:
    """Each fast_ulysses.bench module -> the bench modules it imports (at the top or inside a
    function: either one makes the modules depend on each other)."""
    import ast
    from pathlib import Path

    import fast_ulysses.bench

    folder = Path(fast_ulysses.bench.__file__).parent
    names = {p.stem for p in folder.glob("*.py")} - {"__init__", "__main__"}
    graph = {}
    for name in names:
        deps = set()
        for node in ast.walk(ast.parse((folder / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                if node.module in names:
                    deps.add(node.module)
                deps.update(a.name for a in node.names if node.module is None and a.name in names)
        graph[name] = deps - {name}
    return graph


def test_bench_modules_import_each_other_one_way_only():
    """No two bench modules import each other, directly or through others (a circle means a
    reader following a call comes back to a module already left)."""
    graph = _bench_imports()
    assert graph["stages"] and graph["attention"]  # the walk sees relative imports

    def reaches(start, goal, seen=()):
        return any(
            d == goal or (d not in seen and reaches(d, goal, (*seen, d))) for d in graph[start]
        )

    circles = sorted(name for name in graph if reaches(name, name))
    assert circles == [], f"bench modules in an import circle: {circles}"
