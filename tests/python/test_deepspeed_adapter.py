"""fast_ulysses.integrations.deepspeed.DistributedAttention against the installed DeepSpeed's
own, every (scatter_idx, gather_idx, batch_dim_idx): one 3-rank gloo launch of
_deepspeed_worker.py (P = 1, 2, 3); skipped without deepspeed (requirements/dev.txt)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

import _deepspeed_worker
from multirank import launch

WORLD = 3

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="deepspeed is not installed (requirements/dev.txt)")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launch(Path(_deepspeed_worker.__file__), WORLD, tmp_path_factory.mktemp("deepspeed"),
                  timeout=300, env={"DS_ACCELERATOR": "cpu"})


@pytest.mark.parametrize("check", _deepspeed_worker.check_names(WORLD))
def test_against_deepspeed(ranks, check):
    P = int(check.rsplit("_P", 1)[1])
    ranks.assert_check(check, ranks=range(WORLD - P, WORLD))


def test_all_ranks_exit_cleanly(ranks):
    ranks.assert_clean_exit()
