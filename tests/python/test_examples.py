"""Every example starts the same way: `python examples/<name>.py [--nproc P] [options]`, or under
torchrun on the ranks it launched (examples/_launch.py), and checks every argument before any rank
starts: a bad one is argparse's one error line (exit 2), never a traceback on every rank.

The argument checks run in this process (example_runner.refuse: they end before any rank
starts); the examples' runs are in test_quickstart.py, test_wan_block.py, test_fused.py and
test_diffusers_patch.py."""

from __future__ import annotations

import os
from unittest import mock

import pytest
from example_runner import EXAMPLES, refuse

from fast_ulysses.topology import MAX_RANKS

# Each example and its CPU rank count (the default without a GPU, the example in its refusals).
CPU_RANKS = {
    "quickstart.py": 4,
    "ulysses_layer.py": 4,
    "wan_block.py": 3,
    "wan_fused_attention.py": 3,
    "diffusers_wan.py": 2,
    "usp_attention.py": 4,
}


def test_every_example_is_listed():
    assert sorted(CPU_RANKS) == sorted(
        p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_")
    )


def _assert_one_line_error(result, name: str, message: str) -> None:
    """Exit 2 before any rank starts: nothing on stdout, no traceback, argparse's usage and its
    one error line."""
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == "" and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.startswith(f"usage: {name} "), result.stderr
    assert result.stderr.strip().splitlines()[-1] == f"{name}: error: {message}", result.stderr


@pytest.mark.parametrize("name", sorted(CPU_RANKS))
def test_every_example_takes_nproc(name):
    result = refuse(name, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {name} [-h] [--nproc NPROC]"), result.stdout
    assert f"ranks, 1 to {MAX_RANKS} (default: one per GPU" in " ".join(result.stdout.split())
    assert "--ranks" not in result.stdout


@pytest.mark.parametrize("name", sorted(CPU_RANKS))
@pytest.mark.parametrize(
    "value,why",
    [
        ("0", "is out of range: it must be in [1, {max}]"),
        ("-1", "is out of range: it must be in [1, {max}]"),
        (str(MAX_RANKS + 1), "is out of range: it must be in [1, {max}]"),
        (str(2**63), "is out of range: it must be in [1, {max}]"),
        ("2.0", "is not an integer"),
    ],
)
def test_every_example_refuses_a_bad_rank_count(name, value, why):
    _assert_one_line_error(
        refuse(name, "--nproc", value),
        name,
        f"argument --nproc: {value!r} {why.format(max=MAX_RANKS)} (e.g. {CPU_RANKS[name]})",
    )


@pytest.mark.parametrize("name", sorted(CPU_RANKS))
def test_under_torchrun_nproc_must_match_the_launched_ranks(name):
    """Under torchrun (RANK set) the ranks are torchrun's: a different --nproc is refused, not
    run once per launched process."""
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    with mock.patch.dict(os.environ, env):
        result = refuse(name, "--nproc", "3")
    _assert_one_line_error(
        result,
        name,
        "--nproc is 3 but torchrun launched 2 ranks: leave --nproc out under torchrun, or give "
        "--nproc 2",
    )


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--heads", "0"], "argument --heads: '0' is out of range: it must be >= 1 (e.g. 4)"),
        (["--heads", "x"], "argument --heads: 'x' is not an integer (e.g. 4)"),
        (
            ["--latent", "1", "3", "2"],
            "--latent 1 3 2: HEIGHT 3 is not a multiple of the patch size 2 (e.g. --latent 1 4 2)",
        ),
        (
            ["--latent", "1", "2", "5"],
            "--latent 1 2 5: WIDTH 5 is not a multiple of the patch size 2 (e.g. --latent 1 2 6)",
        ),
        (
            ["--latent", "1", "-2", "2"],
            "argument --latent: '-2' is out of range: it must be >= 1 (e.g. 3 4 4)",
        ),
        (
            ["--latent", "1", "200", "2"],
            "--latent 1 200 2: HEIGHT 200 is more than 128, the 64 positions of the model's "
            "rotary embedding",
        ),
        (
            ["--latent", "1", "2", "2", "--nproc", "2"],
            "--latent 1 2 2 is 1 tokens: diffusers shards them evenly, so the 2 ranks must "
            "divide them (add --anything for any token count)",
        ),
        (
            ["--latent", "1", "2", "2", "--anything"],
            "--latent 1 2 2 is 1 tokens: it must be at least the 2 ranks, one token or more on "
            "every rank",
        ),
        (
            ["--heads", "1"],
            "--heads is 1: it must be at least the 2 ranks, one head or more on every rank (e.g. "
            "--heads 2)",
        ),
        (
            ["--nproc", "1"],
            "--nproc is 1: diffusers' context parallelism needs at least 2 ranks "
            "(ulysses_degree > 1; e.g. --nproc 2)",
        ),
    ],
)
def test_diffusers_example_refuses_a_bad_argument_in_one_line(argv, message):
    """Before: a traceback on every rank, from inside diffusers."""
    _assert_one_line_error(refuse("diffusers_wan.py", *argv), "diffusers_wan.py", message)


@pytest.mark.parametrize(
    "argv,message",
    [
        (
            ["--nproc", "4", "--ulysses-degree", "3"],
            "--ulysses-degree is 3: it must divide the 4 ranks (ring degree x Ulysses degree = "
            "ranks; e.g. --ulysses-degree 2)",
        ),
        (
            ["--ulysses-degree", "0"],
            "argument --ulysses-degree: '0' is out of range: it must be >= 1 (e.g. 2)",
        ),
    ],
)
def test_usp_example_refuses_a_bad_degree_in_one_line(argv, message):
    _assert_one_line_error(refuse("usp_attention.py", *argv), "usp_attention.py", message)
