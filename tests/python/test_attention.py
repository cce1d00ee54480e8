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


def _sdpa_bshd(q, k, v):
    """The reference on one rank: SDPA over (b, s, h, d) tensors."""
    return torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2) for t in (q, k, v))
    ).transpose(1, 2)


BAD_RESULTS = {  # attn_fn's result on (b, h, S, d), and how the message shows it (h heads)
    "half the sequence": (
        lambda q, k, v: q[:, :, : q.shape[2] // 2],
        lambda h: f"a tensor of shape (1, {h}, 2, 8)",
    ),
    "transposed": (
        lambda q, k, v: q.transpose(1, 2),
        lambda h: f"a tensor of shape (1, 4, {h}, 8)",
    ),
    "3-d": (lambda q, k, v: q[0], lambda h: f"a tensor of shape ({h}, 4, 8)"),
    "None": (lambda q, k, v: None, lambda h: "None"),
    "a tuple": (lambda q, k, v: (q, None), lambda h: "a tuple"),
}


@pytest.mark.parametrize("case", sorted(BAD_RESULTS))
@pytest.mark.parametrize("kind", ["plain", "grouped-query", "pipelined"])
def test_attn_fn_result_must_have_q_shape(world1, case, kind):
    """attn_fn's result is checked against SDPA's shape (q's b, h, S; v's d) on the plain, the
    grouped-query and the pipelined path, and the refusal leaves the group usable."""
    group = fu.TorchUlyssesGroup(world1)
    fn, got = BAD_RESULTS[case]
    q = torch.randn(1, 4, 2, 8)
    kv = q[:, :, :1].contiguous() if kind == "grouped-query" else q
    module = fu.UlyssesAttention(group, attn_fn=fn, pipeline=2 if kind == "pipelined" else 1)
    heads = 1 if kind == "pipelined" else 2  # each of the 2 head groups has 1 head
    want = (
        f"attn_fn returned {got(heads)} for q of shape (1, {heads}, 4, 8): it must return a "
        "tensor of "
        f"shape (b, h, S, d_v) = (1, {heads}, 4, 8) (q's b, h and S, v's head dim)"
    )
    with pytest.raises(fu.FastUlyssesError, match=re.escape(want)):
        module(q, kv, kv)
    good = fu.UlyssesAttention(group)(q, q, q)
    torch.testing.assert_close(good, _sdpa_bshd(q, q, q))


def test_attn_fn_must_be_callable():
    with pytest.raises(
        fu.FastUlyssesError,
        match=re.escape("attn_fn is 'sdpa': it must be a callable attn_fn(q, k, v) -> o, or None"),
    ):
        fu.UlyssesAttention(attn_fn="sdpa")


QKV_REFUSALS = {  # (which of q, k, v is replaced, by what, the message)
    "q None": (0, None, "q is a NoneType: it must be a torch.Tensor"),
    "k numpy": (1, "numpy", "k is a ndarray: it must be a torch.Tensor"),
    "v 3-d": (2, "3-d", "v has shape (4, 2, 8): q, k and v must be 4-d tensors"),
    "v float64": (
        2,
        torch.float64,
        "v has dtype torch.float64 but q has torch.float32: q, k and v must have one dtype",
    ),
    "k float16": (
        1,
        torch.float16,
        "k has dtype torch.float16 but q has torch.float32: q, k and v must have one dtype",
    ),
    "v on meta": (2, "meta", "v is on meta but q is on cpu: q, k and v must be on one device"),
}


@pytest.mark.parametrize(
    "case,pipeline",
    # (the pipelined path refused a q or k that is no tensor before any call already)
    [(case, 1) for case in sorted(QKV_REFUSALS)]
    + [(case, 2) for case in sorted(QKV_REFUSALS) if case not in ("q None", "k numpy")],
)
def test_a_refused_forward_leaves_the_module_usable(world1, case, pipeline):
    """q, k and v are checked together before q's call: a forward refused for k or v alone
    raises FastUlyssesError naming it, and the next forward on the same module works (before,
    q's borrowed call had gone out and left its tag waiting for barrier())."""
    module = fu.UlyssesAttention(fu.TorchUlyssesGroup(world1), pipeline=pipeline)
    q = torch.randn(1, 4, 2, 8)
    index, change, message = QKV_REFUSALS[case]
    bad = [q, q.clone(), q.clone()]
    if change == "numpy":
        bad[index] = bad[index].numpy()
    elif change == "3-d":
        bad[index] = bad[index][0]
    elif change == "meta":
        bad[index] = bad[index].to("meta")
    elif isinstance(change, torch.dtype):
        bad[index] = bad[index].to(change)
    else:
        bad[index] = change
    with pytest.raises(fu.FastUlyssesError, match=re.escape(message)):
        module(*bad)
    torch.testing.assert_close(module(q, q, q), _sdpa_bshd(q, q, q))


@pytest.mark.parametrize("pipeline", [1, 2])
def test_one_shot_split_iterators_are_read_once(world1, pipeline):
    """seq_splits and head_splits given as iterators are read once per forward, so q's, k's,
    v's and the output's calls get the same splits (before, q's call used them up)."""
    module = fu.UlyssesAttention(fu.TorchUlyssesGroup(world1), pipeline=pipeline)
    q = torch.randn(1, 4, 2, 8)
    out = module(q, q, q, seq_splits=iter([4]), head_splits=(n for n in [2]))
    torch.testing.assert_close(out, _sdpa_bshd(q, q, q))
    torch.testing.assert_close(module(q, q, q), out)
