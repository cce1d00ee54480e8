"""`fast_ulysses.call`: one call's description, what messages show of it (`describe`), and the
fields no check reads by name (`others`), which both cross-rank checks compare as they are
(tests/workers/call_check.py, unnamed_field, runs them on gloo ranks)."""

from __future__ import annotations

import collections

import torch

from fast_ulysses.call import BORROWED, NAMED, OWNED, Call, describe, make_call, others


def test_a_call_holds_every_argument_of_both_entry_points():
    assert set(Call._fields) == NAMED
    c = make_call(OWNED, torch.zeros(1, 2, 3, 8), 0, "q")
    assert c == (OWNED, c.x, 0, "q", None, None, "bshd", None, None)


def test_describe_names_the_call_with_its_barrier_and_out_where_given():
    x = torch.zeros(1, 2, 3, 8, dtype=torch.bfloat16)
    assert describe(make_call(OWNED, x, 1, "q", [2, 2], None, "sbhd")) == (
        "all_to_all_single_4d(x=(1, 2, 3, 8) torch.bfloat16, mode=1, tag='q', "
        "seq_splits=[2, 2], head_splits=None, layout='sbhd')"
    )
    shown = describe(make_call(BORROWED, x, 0, "b", barrier=False))
    assert shown.endswith("layout='bshd', barrier=False)"), shown
    out = torch.empty(1, 4, 2, 8, dtype=torch.float16)
    shown = describe(make_call(OWNED, x, 0, "q", out=out))
    assert shown.endswith(", out=(1, 4, 2, 8) torch.float16)"), shown


def test_a_field_added_later_is_one_of_the_others_and_is_shown():
    """What a field added to `Call` would be: no check names it, so `others` hands it to both
    checks and `describe` shows it."""
    extended = collections.namedtuple("Extended", (*Call._fields, "novel"))
    c = extended(OWNED, torch.zeros(1, 2, 3, 8), 0, "q", None, None, "bshd", None, None, 3)
    assert others(c) == (("novel", 3),)
    assert describe(c).endswith(", novel=3)")
    assert others(make_call(OWNED, c.x, 0, "q")) == ()
