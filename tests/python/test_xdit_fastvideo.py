"""fast_ulysses.integrations.xfuser (xDiT's USP all-to-alls, patch_xfuser) and
fast_ulysses.integrations.fastvideo against the functions xfuser 0.7.0 and fastvideo 0.2.1
define: one 3-rank gloo launch of _xdit_fastvideo_worker.py (P = 1, 2, 3). The packages are
installed without their dependency trees (requirements/upstream-nodeps.txt, which .ci/run
installs); a check of one that is not there is skipped, saying so."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import _upstream_nodeps
import _xdit_fastvideo_worker as worker
from multirank import launch

WORLD = 3
MISSING = {f: _upstream_nodeps.missing(f) for f in worker.CHECKS}
PRESENT = [f for f, reason in MISSING.items() if not reason]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    if not PRESENT:
        pytest.skip("; ".join(MISSING.values()))
    return launch(Path(worker.__file__), WORLD, tmp_path_factory.mktemp("xdit_fastvideo"),
                  timeout=300, args=("--frameworks", ",".join(PRESENT)))


@pytest.mark.parametrize("framework,check", worker.check_names(WORLD))
def test_against_the_package(ranks, framework, check):
    if MISSING[framework]:
        pytest.skip(MISSING[framework])
    P = int(check.rsplit("_P", 1)[1])
    ranks.assert_check(check, ranks=range(WORLD - P, WORLD))


def test_all_ranks_exit_cleanly(ranks):
    ranks.assert_clean_exit()


def test_patch_xfuser_without_xfuser_says_so(monkeypatch):
    from fast_ulysses.integrations import xfuser

    monkeypatch.setitem(sys.modules, "xfuser", None)
    with pytest.raises(ImportError, match="patch_xfuser needs xfuser"):
        xfuser.patch_xfuser()


def test_group_none_without_xdit_says_so(monkeypatch, world1):
    import torch

    from fast_ulysses.errors import FastUlyssesError
    from fast_ulysses.integrations import xfuser

    monkeypatch.delitem(sys.modules, "xfuser.model_executor.layers.usp", raising=False)
    with pytest.raises(FastUlyssesError, match="xDiT's Ulysses group is not set up"):
        xfuser.input_all_to_all(torch.zeros(1, 2, 2, 8))
