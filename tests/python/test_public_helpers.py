"""The public helpers beside the groups refuse by name: `auto_tag` and `backward_tag`
(fast_ulysses.tags) and `make_group`'s process_group (fast_ulysses.factory)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.distributed as dist

import fast_ulysses as fu
from fast_ulysses.errors import FastUlyssesError

X = torch.zeros(1, 2, 4, 8)
LAYOUT_RULE = "it must be a str, 'bshd', 'sbhd' or 'bhsd'"


@pytest.mark.parametrize(
    "x,message",
    [
        (None, "x is a NoneType: it must be a torch.Tensor"),
        (np.zeros((1, 2, 4, 8)), "x is a ndarray: it must be a torch.Tensor"),
        (torch.zeros(2, 8), "x has shape [2, 8]: it must be 4-d (bshd, sbhd or bhsd)"),
    ],
)
def test_auto_tag_refuses_what_is_not_a_4d_tensor(x, message):
    with pytest.raises(FastUlyssesError, match=re.escape(message) + "$"):
        fu.auto_tag(x, 0)


@pytest.mark.parametrize(
    "mode,layout,message",
    [
        (5, "bshd", "mode=5: must be 0 (sequence -> heads) or 1 (heads -> sequence)"),
        (0, "xyz", "layout='xyz': must be 'bshd', 'sbhd' or 'bhsd'"),
        (0, None, f"layout is None: {LAYOUT_RULE}"),
        (1, 3, f"layout is 3: {LAYOUT_RULE}"),
    ],
)
def test_auto_tag_refuses_a_mode_or_layout_the_plan_refuses(mode, layout, message):
    with pytest.raises(FastUlyssesError, match=re.escape(message)):
        fu.auto_tag(X, mode, layout)


@pytest.mark.parametrize("tag", [None, "", 3, b"q"])
def test_backward_tag_refuses_what_is_no_tag(tag):
    message = f"tag is {tag!r}: a tag must be a non-empty str"
    with pytest.raises(FastUlyssesError, match=re.escape(message) + "$"):
        fu.backward_tag(tag)


@pytest.mark.parametrize("group", ["x", 0, object()])
def test_make_group_refuses_what_is_no_process_group(group):
    message = (
        f"process_group is {group!r}: it must be None (the default group) or a "
        "torch.distributed ProcessGroup"
    )
    with pytest.raises(FastUlyssesError, match=re.escape(message) + "$"):
        fu.make_group(group)


def test_make_group_refuses_a_rank_outside_the_new_group():
    member = dist.GroupMember.NON_GROUP_MEMBER
    message = (
        f"process_group is {member!r} (GroupMember.NON_GROUP_MEMBER): this rank is not in the "
        "group new_group made; call make_group on its members only"
    )
    with pytest.raises(FastUlyssesError, match=re.escape(message) + "$"):
        fu.make_group(member)


def test_make_group_without_init_process_group_says_to_call_it(monkeypatch):
    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # (whatever other tests began)
    message = (
        "process_group is None but torch.distributed is not initialized: call "
        "torch.distributed.init_process_group first, or pass a ProcessGroup"
    )
    with pytest.raises(FastUlyssesError, match=re.escape(message) + "$"):
        fu.make_group()


def test_make_group_refuses_more_ranks_than_one_node_as_a_fast_ulysses_error(world1, monkeypatch):
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 9)
    with pytest.raises(FastUlyssesError, match=re.escape("world_size=9: must be in [1, 8]")):
        fu.make_group(world1, prefer="torch")
