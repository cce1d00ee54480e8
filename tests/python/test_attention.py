"""UlyssesAttention and the ProcessGroup registry: one 3-rank gloo launch of
tests/workers/attention.py (P = 1, 2, 3), one test per check and P (plain, grouped-query and
pipelined attention); argument errors and the head groups of grouped-query and pipelined calls
in process."""

from __future__ import annotations

import re

import attention
import pytest
import torch

import fast_ulysses as fu
from fast_ulysses.attention import group_for

WORLD = 3


@pytest.fixture(scope="module")
def ranks(launch_ranks):
    return launch_ranks("attention", WORLD, timeout=300)


@pytest.mark.parametrize("check", attention.check_names(WORLD))
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
    assert torch.equal(
        module(
            q.transpose(0, 1).contiguous(),
            q.transpose(0, 1).contiguous(),
            q.transpose(0, 1).contiguous(),
            layout="sbhd",
        ),
        3 * q.transpose(0, 1),
    )


def test_mismatched_shapes_raise(world1):
    module = fu.UlyssesAttention(fu.TorchUlyssesGroup(world1))
    with pytest.raises(ValueError, match=r"k has shape \(1, 4, 2, 8\) but q has"):
        module(torch.zeros(1, 5, 2, 8), torch.zeros(1, 4, 2, 8), torch.zeros(1, 5, 2, 8))


def test_bad_group_and_tags_raise(world1):
    with pytest.raises(ValueError, match="group is a str: it must be a fast-ulysses group"):
        group_for("world")
    rule = r"it must be a tuple or list of 4 different tags \(q, k, v, output\)"
    for tags in [("q", "k"), 2, "qkvo", ("q", "k", "q", "o")]:  # short, no sequence, a str, twice
        with pytest.raises(ValueError, match=f"tags is {re.escape(repr(tags))}: {rule}"):
            fu.UlyssesAttention(tags=tags)
    with pytest.raises(ValueError, match="tag is '': a tag must be a non-empty str"):
        fu.UlyssesAttention(tags=("q", "k", "v", ""))


def test_default_group_uses_the_registry(world1):
    assert group_for(None) is group_for(world1)
    assert group_for(None).world_size == 1


def test_grouped_query_shape_errors(world1):
    module = fu.UlyssesAttention(fu.TorchUlyssesGroup(world1))
    q = torch.zeros(1, 5, 6, 8)
    with pytest.raises(
        fu.FastUlyssesError,
        match=r"k has 4 heads but q has 6: q's head count "
        r"must be a multiple of k's",
    ):
        module(q, torch.zeros(1, 5, 4, 8), torch.zeros(1, 5, 4, 8))
    with pytest.raises(
        fu.FastUlyssesError,
        match=r"v has shape \(1, 5, 3, 8\) but k has "
        r"\(1, 5, 2, 8\): k and v must have one shape",
    ):
        module(q, torch.zeros(1, 5, 2, 8), torch.zeros(1, 5, 3, 8))
    with pytest.raises(
        fu.FastUlyssesError,
        match=r"k has shape \(1, 5, 2, 4\) but q has .*"
        r"fewer heads \(dimension 2 in bshd\)",
    ):
        module(q, torch.zeros(1, 5, 2, 4), torch.zeros(1, 5, 2, 4))
    with pytest.raises(fu.FastUlyssesError, match="layout='bdsh': must be"):
        module(q, torch.zeros(1, 5, 2, 8), torch.zeros(1, 5, 2, 8), layout="bdsh")


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "2", None])
def test_pipeline_must_be_a_positive_int(value):
    with pytest.raises(fu.FastUlyssesError, match=f"pipeline is {value!r}: it must be an int >= 1"):
        fu.UlyssesAttention(pipeline=value)


def test_pipeline_past_the_largest_rank_head_count_raises(world1):
    module = fu.UlyssesAttention(fu.TorchUlyssesGroup(world1), pipeline=4)
    q = torch.zeros(1, 5, 3, 8)
    with pytest.raises(
        fu.FastUlyssesError,
        match=r"pipeline is 4 but no rank holds more than "
        r"3 q heads \(head splits \[3\]\)",
    ):
        module(q, q, q)


def test_kv_heads_follow_the_q_heads_of_each_rank():
    """Each rank's kv range is what its q heads use; the send tensor repeats a kv head only for
    ranks that share it; whole k (no copy) when Hkv % P == 0 with even splits."""
    from fast_ulysses.head_groups import head_groups

    (even,) = head_groups((2, 2, 2, 2), 4, 1)  # Hq 8, Hkv 4 on 4 ranks
    assert even.kv_ranges == ((0, 1), (1, 2), (2, 3), (3, 4)) and even.pieces == ((0, 4),)
    assert even.kv_splits == (1, 1, 1, 1) and even.uniform and even.gqa
    (mqa,) = head_groups((2, 2, 2), 1, 1)  # multi-query: kv head 0 to every rank, once each
    assert mqa.pieces == ((0, 1), (0, 1), (0, 1)) and mqa.kv_splits == (1, 1, 1)
    (fewer,) = head_groups((2, 2, 2), 2, 1)  # Hq 6, Hkv 2 on 3 ranks: rank 1 uses both
    assert fewer.kv_ranges == ((0, 1), (0, 2), (1, 2)) and fewer.counts == ((2,), (1, 1), (2,))
    assert fewer.pieces == ((0, 1), (0, 2), (1, 2)) and fewer.uniform
    (uneven,) = head_groups((3, 2, 1, 0), 3, 1)  # Hq 6, Hkv 3, a rank with no q head
    assert uneven.kv_ranges == ((0, 2), (1, 3), (2, 3), (0, 0)) and uneven.kv_splits == (2, 2, 1, 0)
    assert uneven.counts[0] == (2, 1) and not uneven.uniform


def test_pipeline_groups_cut_each_rank_and_keep_kv_groups_whole():
    from fast_ulysses.head_groups import head_groups

    groups = head_groups((4, 4), 4, 2)  # Hq 8, Hkv 4 (2 q heads a kv head), P 2, G 2
    assert [(g.q_start, g.q_count, g.q_splits) for g in groups] == [(0, 4, (2, 2)), (4, 4, (2, 2))]
    assert [g.pieces for g in groups] == [((0, 2),), ((2, 4),)]  # no kv head in two groups
    uneven = head_groups((3, 2, 0), 5, 2)  # no GQA, uneven: each rank's heads cut in 2
    assert [g.q_splits for g in uneven] == [(2, 1, 0), (1, 1, 0)]
    assert [g.q_start for g in uneven] == [0, 3] and sum(g.q_count for g in uneven) == 5
