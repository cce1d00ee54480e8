"""`fast-ulysses plan` on this GPU-free machine, run as a user runs it."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess

import pytest
import torch

import fast_ulysses as fu
from fast_ulysses.cli.main import main
from fast_ulysses.topology import MAX_RANKS


def run_cli(*args) -> subprocess.CompletedProcess:
    """`fast-ulysses *args` in this process (its main, stdout and stderr captured, an argparse
    exit taken as the exit code): a subprocess per test only paid torch's import again.
    tests/python/test_cli.py runs the command as its own process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 1
    return subprocess.CompletedProcess(args, code, out.getvalue(), err.getvalue())


def test_plan_wan_720p_prints_chunk_bytes():
    result = run_cli("plan", "--preset", "wan-720p", "--world-size", "8")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("12,096,000") >= 8
    assert "96,768,000" in result.stdout


def test_plan_custom_shape_uneven_heads():
    result = run_cli(
        "plan",
        "--shape",
        "1,100,12,128",
        "--world-size",
        "8",
        "--head-splits",
        "2,2,2,2,1,1,1,1",
        "--rank",
        "7",
        "--layout",
        "sbhd",
    )
    assert result.returncode == 0, result.stderr
    assert "head_splits [2, 2, 2, 2, 1, 1, 1, 1]" in result.stdout


def _assert_usage_error(result, *expected: str) -> str:
    """Exit 2, nothing on stdout, no traceback, and the last stderr line is argparse's one-line
    error naming the argument and the rule."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr and "Error:" not in result.stderr, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("fast-ulysses plan: error: "), result.stderr
    for text in expected:
        assert text in line, (text, line)
    return line


def test_plan_bad_call_is_a_clear_error():
    result = run_cli("plan", "--shape", "1,100,12,128", "--world-size", "8")
    _assert_usage_error(result, "pass head_splits")


@pytest.mark.parametrize(
    "world_size,shown",
    [(str(v), repr(str(v))) for v in (0, MAX_RANKS + 1, -2, 2**63, -(2**63) - 1, 2**64)]
    + [("9" * 5000, repr("9" * 37 + "..."))],
)
def test_plan_world_size_out_of_range(world_size, shown):
    """Any integer outside [1, max_world_size] names that range (the plan's limit, read from
    _C), past int64 too: not int64's range."""
    result = run_cli("plan", "--preset", "wan-720p", "--world-size", world_size)
    _assert_usage_error(
        result,
        f"argument --world-size: {shown} is out of range: it must be in [1, {MAX_RANKS}] (e.g. 8)",
    )


@pytest.mark.parametrize(
    "option,example",
    [("--seq-splits", "4,3,3 for 3 ranks"), ("--head-splits", "2,1,1 for 3 ranks")],
)
def test_plan_bad_splits_suggest_splits_not_a_shape(option, example):
    args = ["plan", "--shape", "1,100,16,128", "--world-size", "2", option, "1,x"]
    line = _assert_usage_error(run_cli(*args), f"argument {option}: ")
    assert line.endswith(f"(give comma-separated integers, e.g. {example})"), line
    assert "1,9450,40,128" not in line


@pytest.mark.parametrize("rank", [8, -1])
def test_plan_rank_out_of_range(rank):
    result = run_cli("plan", "--preset", "wan-720p", "--world-size", "8", "--rank", str(rank))
    _assert_usage_error(result, f"rank={rank}: must be in [0, world_size=8)")


def test_plan_rank_out_of_range_with_shape():
    result = run_cli("plan", "--shape", "1,100,16,128", "--world-size", "4", "--rank", "4")
    _assert_usage_error(result, "rank=4: must be in [0, world_size=4)")


@pytest.mark.parametrize("option", ["--seq-splits", "--head-splits"])
def test_plan_empty_list_is_refused_not_ignored(option):
    """An empty split list must not read as "splits not given" (even splits)."""
    args = ["plan", "--world-size", "4", "--shape", "1,100,16,128", option, ""]
    _assert_usage_error(run_cli(*args), f"argument {option}: ", "'' holds no integer")


@pytest.mark.parametrize(
    "option,value,item",
    [
        ("--shape", "1,100,,16,128", 3),
        ("--seq-splits", "1,,1", 2),
        ("--head-splits", "1,,1", 2),
        ("--head-splits", "8,8,", 3),
    ],
)
def test_plan_empty_item_in_a_list_is_refused(option, value, item):
    """An empty item is a usage error, not skipped (1,,1 is not read as [1, 1])."""
    args = ["plan", "--world-size", "2"]
    args += [option, value] if option == "--shape" else ["--shape", "1,2,16,128", option, value]
    _assert_usage_error(run_cli(*args), f"argument {option}: ", f"{value!r}: item {item} is empty")


@pytest.mark.parametrize("option", ["--shape", "--seq-splits", "--head-splits"])
def test_plan_non_integer_list(option):
    args = ["plan", "--world-size", "8"]
    args += (
        [option, "1,100,12,x"]
        if option == "--shape"
        else ["--shape", "1,100,16,128", option, "1,x"]
    )
    line = _assert_usage_error(run_cli(*args), f"argument {option}: ", "'x' is not an integer")
    assert "invalid _ints value" not in line


def test_plan_preset_and_shape_together():
    result = run_cli("plan", "--preset", "wan-720p", "--shape", "1,100,12,128", "--world-size", "8")
    _assert_usage_error(result, "--shape", "not allowed with argument --preset")


def test_plan_needs_preset_or_shape():
    result = run_cli("plan", "--world-size", "8")
    _assert_usage_error(result, "one of the arguments --preset --shape is required")


def test_plan_wrong_rank_count_of_shape():
    result = run_cli("plan", "--shape", "1,100,12", "--world-size", "4", "--json")
    _assert_usage_error(result, "input shape [1, 100, 12]: must have 4 dimensions")


def test_plan_json_wan_720p():
    result = run_cli("plan", "--preset", "wan-720p", "--world-size", "8", "--rank", "3", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["world_size"] == 8 and out["rank"] == 3 and out["mode"] == 0
    assert out["layout"] == "bshd" and out["dtype"] == "bfloat16" and out["element_size"] == 2
    assert out["input_shape"] == [1, 9450, 40, 128]
    assert out["output_shape"] == [1, 75600, 5, 128]
    assert out["seq_splits"] == [9450] * 8 and out["head_splits"] == [5] * 8
    assert out["bytes_per_peer"] == [12_096_000] * 8
    assert out["window_bytes"] == 96_768_000
    assert out["total_bytes"] == 8 * 12_096_000 and out["remote_bytes"] == 7 * 12_096_000
    assert [d["peer"] for d in out["descriptors"]] == list(range(8))


def test_plan_json_matches_the_python_plan():
    args = dict(world_size=8, rank=7, mode=1, shape=(100, 1, 1, 128))
    result = run_cli(
        "plan",
        "--shape",
        "100,1,1,128",
        "--world-size",
        "8",
        "--rank",
        "7",
        "--mode",
        "1",
        "--layout",
        "sbhd",
        "--dtype",
        "fp16",
        "--head-splits",
        "2,2,2,2,1,1,1,1",
        "--seq-splits",
        "13,13,13,13,12,12,12,12",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    p = fu.plan(
        args["world_size"],
        args["rank"],
        args["mode"],
        args["shape"],
        torch.float16,
        head_splits=[2, 2, 2, 2, 1, 1, 1, 1],
        seq_splits=[13] * 4 + [12] * 4,
        layout="sbhd",
    )
    assert out["dtype"] == "float16" and out["layout"] == "sbhd" and out["mode"] == 1
    assert out["seq_splits"] == [13] * 4 + [12] * 4
    assert out["element_size"] == 2 and len(out["descriptors"]) == 8
    assert out["input_shape"] == list(p.input_shape)
    assert out["output_shape"] == list(p.output_shape)
    assert out["seq_splits"] == p.seq_splits and out["head_splits"] == p.head_splits
    assert out["window_bytes"] == p.window_bytes
    assert out["bytes_per_peer"] == [d.bytes for d in p]
    fields = (
        "peer",
        "src_offset",
        "dst_offset",
        "width",
        "height",
        "depth",
        "src_pitch",
        "dst_pitch",
        "src_slice_pitch",
        "dst_slice_pitch",
    )
    assert [[d[f] for f in fields] for d in out["descriptors"]] == [d.as_list() for d in p]
    assert [d["bytes"] for d in out["descriptors"]] == out["bytes_per_peer"]


@pytest.mark.parametrize(
    "layout,shape",
    [("bshd", [1, 9450, 40, 128]), ("sbhd", [9450, 1, 40, 128]), ("bhsd", [1, 40, 9450, 128])],
)
def test_plan_layout_reorders_the_presets_shape(layout, shape):
    """--layout bhsd (and sbhd) gives the preset's bshd shape in that order, and the plan of that
    call: the same bytes per peer whatever the layout."""
    result = run_cli(
        "plan", "--preset", "wan-720p", "--world-size", "8", "--layout", layout, "--json"
    )
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["layout"] == layout and out["input_shape"] == shape
    p = fu.plan(8, 0, 0, shape, torch.bfloat16, layout=layout)
    assert [
        [d[f] for f in ("width", "height", "src_pitch", "dst_pitch")] for d in out["descriptors"]
    ] == [[d.width, d.height, d.src_pitch, d.dst_pitch] for d in p]
    assert out["bytes_per_peer"] == [12_096_000] * 8


def test_plan_lse_rows_of_four_bytes():
    """fp32 with d = 1 (the softmax LSE of ring attention) is a valid call."""
    result = run_cli("plan", "--shape", "2,6,8,1", "--world-size", "2", "--dtype", "fp32", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["element_size"] == 4 and out["output_shape"] == [2, 12, 4, 1]
    assert out["bytes_per_peer"] == [2 * 6 * 4 * 4] * 2


def test_plan_unknown_layout_is_a_usage_error():
    result = run_cli("plan", "--shape", "1,4,8,64", "--world-size", "2", "--layout", "bsdh")
    _assert_usage_error(result, "--layout", "bhsd")


BEYOND = "is beyond int64: it must be in [-2^63, 2^63 - 1]"


@pytest.mark.parametrize(
    "call,option,value",
    [
        ("--preset", "--rank", str(2**64)),
        ("--shape", "--rank", str(2**63)),
    ],
)
def test_plan_option_beyond_int64_is_a_usage_error(call, option, value):
    """An integer the ops cannot take is argparse's one-line error naming the option, not a
    traceback from the op's schema."""
    given = {"--world-size": "8", "--rank": "0", option: value}
    args = [
        "plan",
        *(["--preset", "wan-720p"] if call == "--preset" else ["--shape", "1,100,16,128"]),
    ]
    for name, text in given.items():
        args += [name, text]
    _assert_usage_error(run_cli(*args), f"argument {option}: '{value}' {BEYOND}")


@pytest.mark.parametrize(
    "option,value",
    [
        ("--shape", 2**63),
        ("--shape", -(2**63) - 1),
        ("--seq-splits", 2**64),
        ("--head-splits", 2**63),
    ],
)
def test_plan_list_entry_beyond_int64_is_a_usage_error(option, value):
    args = ["plan", "--world-size", "2"]
    args += (
        [option, f"1,100,16,{value}"]
        if option == "--shape"
        else ["--shape", "1,100,16,128", option, f"1,{value}"]
    )
    _assert_usage_error(run_cli(*args), f"argument {option}: ", f"'{value}' {BEYOND}")


@pytest.mark.parametrize(
    "option,value,example",
    [
        ("--world-size", "2.0", 8),
        ("--rank", "True", 0),
        ("--mode", "1.0", 0),
    ],
)
def test_plan_non_integer_option_names_it(option, value, example):
    args = ["plan", "--shape", "1,100,16,128", "--world-size", "2", option, value]
    _assert_usage_error(
        run_cli(*args), f"argument {option}: '{value}' is not an integer (e.g. {example})"
    )


def test_plan_integer_too_long_to_read_is_beyond_int64():
    """More digits than int() reads (4300) is still an integer past int64, not a traceback."""
    result = run_cli("plan", "--shape", "1,100,16," + "9" * 5000, "--world-size", "2")
    _assert_usage_error(result, "argument --shape: ", BEYOND)
