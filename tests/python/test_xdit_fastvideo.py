"""fast_ulysses.integrations.xfuser (xDiT's USP all-to-alls, the combined q/k/v as one call,
patch_xfuser) and fast_ulysses.integrations.fastvideo (all_to_all_4D, patch_fastvideo) against
the functions xfuser 0.7.0 and fastvideo 0.2.1 define: one 3-rank gloo launch of
tests/workers/xdit_fastvideo.py (P = 1, 2, 3). The packages are installed without their
dependency trees (requirements/upstream-nodeps.txt, which .ci/run installs); a check of one that
is not there is skipped, saying so."""

from __future__ import annotations

import sys

import pytest
import upstream_nodeps
import xdit_fastvideo as worker

WORLD = 3
MISSING = {f: upstream_nodeps.missing(f) for f in worker.CHECKS}
PRESENT = [f for f, reason in MISSING.items() if not reason]


@pytest.fixture(scope="module")
def ranks(launch_ranks):
    if not PRESENT:
        pytest.skip("; ".join(MISSING.values()))
    return launch_ranks("xdit_fastvideo", WORLD, "--frameworks", ",".join(PRESENT), timeout=300)


@pytest.mark.full  # a real upstream package's launch: the full tier's
@pytest.mark.parametrize("framework,check", worker.check_names(WORLD))
def test_against_the_package(ranks, framework, check):
    if MISSING[framework]:
        pytest.skip(MISSING[framework])
    P = int(check.rsplit("_P", 1)[1])
    ranks.assert_check(check, ranks=range(WORLD - P, WORLD))


@pytest.mark.full  # a real upstream package's launch: the full tier's
def test_all_ranks_exit_cleanly(ranks):
    ranks.assert_clean_exit()


def test_patch_xfuser_without_xfuser_says_so(monkeypatch):
    from fast_ulysses.integrations import xfuser

    monkeypatch.setitem(sys.modules, "xfuser", None)
    with pytest.raises(ImportError, match="patch_xfuser needs xfuser"):
        xfuser.patch_xfuser()


def test_patch_fastvideo_without_fastvideo_says_so(monkeypatch):
    from fast_ulysses.integrations import fastvideo

    monkeypatch.setitem(sys.modules, "fastvideo", None)
    monkeypatch.delitem(sys.modules, "fastvideo.distributed.parallel_state", raising=False)
    with pytest.raises(ImportError, match="patch_fastvideo needs fastvideo"):
        fastvideo.patch_fastvideo()
    assert fastvideo.unpatch_fastvideo() == []  # nothing was patched


def test_group_none_without_xdit_says_so(monkeypatch, world1):
    import torch

    from fast_ulysses.errors import FastUlyssesError
    from fast_ulysses.integrations import xfuser

    monkeypatch.delitem(sys.modules, "xfuser.model_executor.layers.usp", raising=False)
    with pytest.raises(FastUlyssesError, match="xDiT's Ulysses group is not set up"):
        xfuser.input_all_to_all(torch.zeros(1, 2, 2, 8))


def test_xfuser_takes_a_fast_ulysses_group(world1):
    import torch

    import fast_ulysses as fu
    from fast_ulysses.integrations import xfuser

    x = torch.randn(1, 2, 2, 8)
    group = fu.make_group(world1)
    try:
        assert xfuser.input_all_to_all(x, group=group) is x  # P = 1: unchanged, as xDiT
        assert all(t is x for t in xfuser.combined_qkv_all_to_all(x, x, x, group=group))
    finally:
        group.destroy()


def test_xfuser_refuses_a_group_that_is_not_one(world1):
    import re

    import torch

    from fast_ulysses.errors import FastUlyssesError
    from fast_ulysses.integrations import xfuser

    with pytest.raises(FastUlyssesError, match=re.escape("group is a str: it must be a")):
        xfuser.input_all_to_all(torch.zeros(1, 2, 2, 8), group="g")


def test_xfuser_checks_tensors_at_every_world_size(world1):
    """A 3-d tensor is refused at P = 1 too, so a program does not fail only once P > 1."""
    import re

    import torch

    from fast_ulysses.errors import FastUlyssesError
    from fast_ulysses.integrations import xfuser

    x = torch.zeros(1, 2, 2, 8)
    with pytest.raises(
        FastUlyssesError, match=re.escape("v has shape (2, 2, 8): xDiT's USP all-to-alls take")
    ):
        xfuser.combined_qkv_all_to_all(x, x, x[0], group=world1)


def test_xfuser_combined_refuses_what_xdit_cannot_stack(world1):
    """xDiT stacks q, k, v (one all-to-all): k or v not shaped like q is refused at every P."""
    import re

    import torch

    from fast_ulysses.errors import FastUlyssesError
    from fast_ulysses.integrations import xfuser

    q, kv = torch.zeros(1, 4, 2, 8), torch.zeros(1, 2, 2, 8)
    with pytest.raises(
        FastUlyssesError,
        match=re.escape("(1, 4, 2, 8), (1, 2, 2, 8), (1, 2, 2, 8): xDiT's _combined_qkv_all"),
    ):
        xfuser.combined_qkv_all_to_all(q, kv, kv, group=world1)
    assert all(t is q for t in xfuser.combined_gqa_qkv_all_to_all(q, q, q, group=world1))


def test_xfuser_combined_gqa_checks_xdits_rules_at_every_world_size(world1):
    import torch

    from fast_ulysses.errors import FastUlyssesError
    from fast_ulysses.integrations import xfuser

    q, k = torch.zeros(1, 4, 2, 8), torch.zeros(1, 2, 2, 8)
    cases = (
        ((q, k, torch.zeros(1, 2, 3, 8)), "k and v must have identical shapes"),
        ((q, torch.zeros(2, 2, 2, 8), torch.zeros(2, 2, 2, 8)), "q's batch and head dim"),
        ((q, k, k, torch.zeros(1, 4, 3, 8)), "extra tensors must be shaped like q"),
    )
    for tensors, rule in cases:
        with pytest.raises(FastUlyssesError, match=rule):
            xfuser.combined_gqa_qkv_all_to_all(*tensors, group=world1)
