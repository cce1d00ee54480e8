"""UlyssesAttention and the ProcessGroup registry: one 3-rank gloo launch of _attention_worker.py
(P = 1, 2, 3), one test per check and P; argument errors in process."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import fast_ulysses as fu
from fast_ulysses.attention import group_for

import _attention_worker
from multirank import launch

WORLD = 3
WORKER = Path(_attention_worker.__file__)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return launch(WORKER, WORLD, tmp_path_factory.mktemp("attention"), timeout=300)


@pytest.mark.parametrize("check", _attention_worker.check_names(WORLD))
def test_worker_check(ranks, check):
    P = int(check.rsplit("_P", 1)[1])
    ranks.assert_check(check, ranks=range(WORLD - P, WORLD))


def test_all_ranks_exit_cleanly(ranks):
    ranks.assert_clean_exit()


def test_custom_attn_fn_sees_bhsd(world1):
    seen = []

    def attn(q, k, v):
        seen.append(tuple(q.shape))
        return q + k + v

    module = fu.UlyssesAttention(fu.TorchUlyssesGroup(world1), attn_fn=attn)
    q = torch.randn(2, 5, 3, 8)
    out = module(q, q, q)
    assert seen == [(2, 3, 5, 8)] and torch.equal(out, 3 * q)
    assert torch.equal(module(q.transpose(0, 1).contiguous(), q.transpose(0, 1).contiguous(),
                              q.transpose(0, 1).contiguous(), layout="sbhd"),
                       3 * q.transpose(0, 1))


def test_mismatched_shapes_raise(world1):
    module = fu.UlyssesAttention(fu.TorchUlyssesGroup(world1))
    with pytest.raises(ValueError, match=r"k has shape \(1, 4, 2, 8\) but q has"):
        module(torch.zeros(1, 5, 2, 8), torch.zeros(1, 4, 2, 8), torch.zeros(1, 5, 2, 8))


def test_bad_group_and_tags_raise(world1):
    with pytest.raises(ValueError, match="group is a str: it must be a fast-ulysses group"):
        group_for("world")
    with pytest.raises(ValueError, match="tags is .*: it must name 4 tags"):
        fu.UlyssesAttention(tags=("q", "k"))


def test_default_group_uses_the_registry(world1):
    assert group_for(None) is group_for(world1)
    assert group_for(None).world_size == 1
