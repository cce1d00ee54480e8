"""fast_ulysses.integrations.deepspeed.DistributedAttention against the installed DeepSpeed's
own, every (scatter_idx, gather_idx, batch_dim_idx): one 3-rank gloo launch of
tests/workers/deepspeed_adapter.py (P = 1, 2, 3); skipped without deepspeed (requirements/dev.txt)."""

from __future__ import annotations

import importlib.util

import deepspeed_adapter as worker
import pytest

WORLD = 3

pytestmark = [
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed (requirements/dev.txt)",
    ),
    pytest.mark.full,  # real DeepSpeed on 3 ranks: the full tier's
]


@pytest.fixture(scope="module")
def ranks(launch_ranks):
    return launch_ranks("deepspeed_adapter", WORLD, timeout=300, env={"DS_ACCELERATOR": "cpu"})


@pytest.mark.parametrize("check", worker.check_names(WORLD))
def test_against_deepspeed(ranks, check):
    P = int(check.rsplit("_P", 1)[1])
    ranks.assert_check(check, ranks=range(WORLD - P, WORLD))


def test_all_ranks_exit_cleanly(ranks):
    ranks.assert_clean_exit()
