"""The bench's USP row (bench/usp.py) without a GPU: --ring-degree, its skip reasons, the
(ring x Ulysses) layout and splits, the table rows, and the row end to end on gloo CPU ranks
(the timer, CUDA events, replaced by one that runs the call once)."""

from __future__ import annotations

import argparse
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import fast_ulysses as fu
from fast_ulysses.bench import command as bench
from fast_ulysses.bench import report, usp
from fast_ulysses.bench.stages import Case
from fast_ulysses.mesh import standard_layout


def _parse(*argv):
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_ring_degree_option_defaults_to_no_row_and_takes_auto_or_a_degree():
    assert _parse().ring_degree == 0
    assert _parse("--ring-degree", "auto").ring_degree == "auto"
    assert _parse("--ring-degree", "4").ring_degree == 4
    for bad in ("-1", "two"):
        with pytest.raises(SystemExit):
            _parse("--ring-degree", bad)


def test_ring_degree_auto_and_the_skip_reasons():
    assert usp.ring_degree("auto", 1) == (1, "")
    assert usp.ring_degree("auto", 8) == (2, "")
    assert usp.ring_degree(4, 8) == (4, "") and usp.ring_degree(1, 8) == (1, "")
    ring, why = usp.ring_degree("auto", 3)
    assert ring is None and why.startswith("--ring-degree auto: P = 3 is odd"), why
    assert usp.ring_degree(3, 8) == (None, "--ring-degree 3 does not divide P = 8")


@pytest.mark.parametrize("world_size, ring", [(8, 2), (8, 4), (4, 4), (6, 3), (2, 1)])
def test_layout_is_usp_meshs(world_size, ring):
    groups, rings = usp.usp_layout(world_size, ring)
    want = standard_layout(world_size, world_size // ring, [""] * world_size)
    assert [tuple(g) for g in groups] == list(want.ulysses_groups)
    assert [tuple(r) for r in rings] == list(want.rings)


def test_usp_splits_are_the_ulysses_groups_rows_and_even_heads():
    case = Case("t", 1, [3, 2, 2, 2], [2, 2, 1, 1], 16, torch.float32)
    assert usp.usp_kwargs(case, 2, 0) == {"seq_splits": [3, 2], "head_splits": [3, 3]}
    assert usp.usp_kwargs(case, 2, 3) == {"seq_splits": [2, 2], "head_splits": [3, 3]}
    assert usp.usp_kwargs(case, 4, 2) == {"seq_splits": [2], "head_splits": [6]}


def _result(**kw):
    u = {
        "ring_degree": 2,
        "plain": "UlyssesAttention, Ulysses 8",
        "ring": "UlyssesAttention, ring 2 x Ulysses 4",
        "plain_ms": 20.0,
        "ring_ms": 25.0,
        "max_abs_diff": 0.0039,
        "skipped": None,
        "error": None,
    }
    u.update(kw)
    results = {
        "machine": {"gpu": "test", "world_size": 8, "shared_gpu": False},
        "cases": [{"case": "wan-720p", "mode": 0, "result": {"usp": u}}],
    }
    return {row[1]: row[2:] for row in report.usp_rows("wan-720p m0", u)}, results


def test_usp_rows_give_both_times_the_ratio_and_the_difference():
    rows, _ = _result()
    assert rows["UlyssesAttention, Ulysses 8 (forward, no grad)"] == [
        "20.000",
        "n/a",
        "1.00x plain's time",
        "n/a",
    ]
    assert rows["UlyssesAttention, ring 2 x Ulysses 4 (forward, no grad), max |diff| 0.0039"] == [
        "25.000",
        "n/a",
        "1.25x plain's time",
        "n/a",
    ]
    rows, _ = _result(ring_degree=None, skipped="--ring-degree 3 does not divide P = 8")
    assert rows == {
        "USP ring x Ulysses (forward, no grad)": [
            "n/a: skipped: --ring-degree 3 does not divide P = 8",
            "",
            "",
            "",
        ]
    }
    rows, _ = _result(plain_ms=None, ring_ms=None, error="rank 1: RuntimeError: boom")
    assert rows["USP ring 2 (forward, no grad)"][0] == "n/a: rank 1: RuntimeError: boom"


def test_table_json_and_plot_carry_the_usp_row(tmp_path):
    import io
    import json

    from rich.console import Console

    _, results = _result()
    results["cases"][0]["result"].update(
        bytes_in=1000,
        fast_copy_ms=0.5,
        fast_borrowed_ms=0.4,
        own_share_ms=0.05,
        fast_copy_host_us=40.0,
        fast_borrowed_host_us=30.0,
    )
    results.update(baseline_note="n/a", padding=[])
    buffer = io.StringIO()
    report.print_table(results, Console(file=buffer, width=250))
    assert "ring 2 x Ulysses 4 (forward, no grad), max |diff| 0.0039" in buffer.getvalue()
    path = report.write_json(results, tmp_path, "t")
    assert json.loads(path.read_text())["cases"][0]["result"]["usp"]["ring_ms"] == 25.0
    assert report.write_plot(results, tmp_path / "p.png").exists()


def test_the_slowest_rank_gives_the_largest_time_and_difference():
    _, results = _result()
    u = results["cases"][0]["result"]["usp"]
    other = dict(u, ring_ms=30.0, max_abs_diff=0.01)
    merged = report.slowest([{"usp": u}, {"usp": other}])["usp"]
    assert merged["ring_ms"] == 30.0 and merged["max_abs_diff"] == 0.01
    assert merged["plain"] == u["plain"] and merged["skipped"] is None


def _fake_timer(timed):
    """A median_ms that runs the call once (CUDA events need a GPU) and counts it."""

    def median(fn, iters, warmup):
        fn()
        timed.append((iters, warmup))
        return float(len(timed))

    return median


def test_ring_of_one_times_ring_attention_against_sdpa_on_cpu(world1, monkeypatch):
    """P = 1, auto: R = 1, ring_attention with no ring against SDPA on this rank's heads."""
    timed = []
    monkeypatch.setattr(usp, "median_ms", _fake_timer(timed))
    case = Case("t", 1, [12], [6], 16, torch.float32)
    x = torch.randn(case.input_shape(0, 0))
    ctx = argparse.Namespace(
        fast=fu.TorchUlyssesGroup(world1), ring_degree="auto", iters=50, warmup=10
    )
    got = usp.run_usp(case, ctx, x)
    assert got["error"] is None and got["skipped"] is None, got
    assert (got["ring_degree"], got["plain_ms"], got["ring_ms"]) == (1, 1.0, 2.0)
    assert got["plain"] == "SDPA on this rank's heads"
    assert got["max_abs_diff"] < 1e-5, got
    assert timed == [(usp.MAX_ITERS, usp.MAX_WARMUP)] * 2
    ctx.ring_degree = 2
    got = usp.run_usp(case, ctx, x)
    assert got["skipped"] == "--ring-degree 2 does not divide P = 1" and len(timed) == 2


def _usp_worker(rank, world_size, store, case):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    timed = []
    usp.median_ms = _fake_timer(timed)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(case.input_shape(rank, 0), generator=g)
    ctx = argparse.Namespace(fast=fu.TorchUlyssesGroup(), ring_degree=2, iters=5, warmup=1)
    for ring, name in ((2, "ring 2 x Ulysses 2"), (4, "ring 4 x Ulysses 1")):
        ctx.ring_degree = ring
        got = usp.run_usp(case, ctx, x)
        assert got["error"] is None, got
        assert got["ring"] == f"UlyssesAttention, {name}", got
        assert got["plain"] == "UlyssesAttention, Ulysses 4", got
        assert got["max_abs_diff"] < 1e-5, (rank, ring, got)
        group = ctx.usp_groups[ring]  # make_group's pair: the ring is the group's ring_group
        assert (group.world_size, dist.get_world_size(group.ring_group)) == (4 // ring, ring)
    assert len(timed) == 4
    usp.close(ctx)
    ctx.fast.destroy()
    dist.destroy_process_group()


def test_usp_row_runs_on_four_cpu_ranks():
    """P = 4 on gloo: ring 2 x Ulysses 2 and ring 4 x Ulysses 1 against plain Ulysses over 4,
    with uneven rows (ring blocks of 5 and 4 rows) and uneven heads: outputs agree."""
    case = Case("t", 1, [3, 2, 2, 2], [2, 2, 1, 1], 16, torch.float32)
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_usp_worker, args=(4, os.path.join(tmp, "s"), case), nprocs=4)
