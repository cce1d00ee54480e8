"""One rank of test_call_check.py (run through multirank.py, or by torchrun): a gloo world
of 3 CPU ranks; for P = 1, 2, 3 the last P ranks form a subgroup and run TorchUlyssesGroup's call
check (every call first compares every rank's call, FAST_ULYSSES_CHECK_CALLS) and `out=`.

Checks, each a `Report.check` named "<check>_P<p>"; those of MISMATCH_CHECKS and SWITCH_CHECKS
run at P > 1 only, OUT_CHECKS at every P. A check that expects a refusal requires a
FastUlyssesError on every rank of the subgroup (with one message on all of them where the calls
differ), then a call every rank makes alike, which must give simulate's result bit for bit:
the group is still usable.

  forgotten_seq_splits  ranks hold different numbers of rows and pass no seq_splits (both entry
                        points); then the same call with seq_splits works
  head_splits_one_rank  head_splits=[3, 1] (P = 2) or [3, 2, 1] (P = 3) on group rank 0 only
  mode_differs          Mode.HEAD_TO_SEQ on group rank 0, 0 on the others (shapes fit both)
  tag_differs           another tag on the last rank
  layout_differs        sbhd on group rank 0, bshd on the others (one shape fits both)
  invalid_one_rank      a call only the last rank's plan refuses (heads P does not divide); an
                        empty tag there; a borrowed call on an input that requires grad on
                        group rank 0 only: the refusal names the invalid call and a valid one
  other_fields          dtype, barrier, owned against borrowed, and batch and head_dim (with
                        one window size)
  unnamed_field         a field no check reads by name (a `Call` with one more field, `novel`,
                        as a field added to it later would be) that differs on group rank 0
                        only: refused on every rank by the call check and by the debug check,
                        neither edited for it; alike on every rank, the call goes ahead
  every_rank_invalid    every rank refuses its own call: each raises its own plan message
  device_differs        x on meta on the last rank only (both entry points, and with out= on
                        meta there): the refusal names its device; meta on every rank: each
                        raises the device rule; with meta allowed on every rank's group (a
                        stand-in for cpu against cuda, which needs a GPU), ranks whose device
                        types differ raise naming both devices
  check_gathers         one all_gather_into_tensor per call (a backward is a call), no
                        all_gather_object on the success path; with FAST_ULYSSES_CHECK_CALLS=0
                        none, and the calls still match simulate
  switch_disagrees      FAST_ULYSSES_CHECK_CALLS=0 on the last rank only, or a value it
                        refuses there: building the group (directly, or by make_group) raises
                        on every rank
  debug_replaces_check  FAST_ULYSSES_DEBUG=1: the debug check runs instead (no row gather); it
                        refuses a bad out= on one rank, and a batch and head_dim that differ
                        with one window size, on every rank
  out_bit_exact         out= fills and returns the caller's tensor, bit-exact with simulate and
                        with the call without out=, for both modes, every layout, b = 1 and 2
                        (receiving straight into out, and through a copy), even and uneven
                        splits; out= on some ranks only; an input that requires grad under
                        torch.no_grad()
  out_refused           a wrong dtype, shape or device, a non-contiguous out, an out overlapping
                        x, an x or an out that requires grad, a non-tensor: refused (on the last
                        rank only, so at P > 1 every rank raises naming it), nothing sent
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys

import torch
import torch.distributed as dist
from multirank import run_on_subgroups

import fast_ulysses as fu
from fast_ulysses.call import OWNED, Call
from fast_ulysses.errors import FastUlyssesError
from fast_ulysses.plan import input_shape

MISMATCH_CHECKS = [
    "forgotten_seq_splits",
    "head_splits_one_rank",
    "mode_differs",
    "tag_differs",
    "layout_differs",
    "invalid_one_rank",
    "other_fields",
    "unnamed_field",
    "every_rank_invalid",
    "device_differs",
]
SWITCH_CHECKS = ["check_gathers", "switch_disagrees", "debug_replaces_check"]
OUT_CHECKS = ["out_bit_exact", "out_refused"]
CHECK_ENV = "FAST_ULYSSES_CHECK_CALLS"


def seeded(shape, seed, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=g) * 100).to(dtype)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.shape == b.shape
        and a.dtype == b.dtype
        and torch.equal(
            a.contiguous().reshape(-1).view(torch.uint8),
            b.contiguous().reshape(-1).view(torch.uint8),
        )
    )


def refused_everywhere(pg, call, *needles, same: bool = True) -> str:
    """Runs `call`, which must raise FastUlyssesError containing every needle; with `same`, the
    message must be the same on every rank of `pg`. Returns the message."""
    try:
        call()
    except FastUlyssesError as error:
        text = str(error)
    else:
        raise AssertionError(f"the call was not refused (expected {needles})")
    missing = [n for n in needles if n not in text]
    assert not missing, f"{missing} not in: {text}"
    if same:
        everyone = [None] * dist.get_world_size(pg)
        dist.all_gather_object(everyone, text, group=pg)
        assert len(set(everyone)) == 1, f"the ranks' messages differ: {everyone}"
    return text


def agreed(group, seed: int, tag: str = "agreed") -> None:
    """A call every rank makes alike: its result must be simulate's, bit for bit."""
    P = group.world_size
    inputs = [seeded((1, 2, 2 * P, 8), seed + k) for k in range(P)]
    got = group.all_to_all_single_4d(inputs[group.rank], 0, tag)
    assert same_bits(got, fu.simulate(inputs, 0)[group.rank]), "agreed call: wrong result"


@contextlib.contextmanager
def counting():
    """Counts the torch.distributed all_gather_into_tensor and all_gather_object calls."""
    counts = {"rows": 0, "objects": 0}
    rows, objects = dist.all_gather_into_tensor, dist.all_gather_object

    def count_rows(*args, **kwargs):
        counts["rows"] += 1
        return rows(*args, **kwargs)

    def count_objects(*args, **kwargs):
        counts["objects"] += 1
        return objects(*args, **kwargs)

    dist.all_gather_into_tensor, dist.all_gather_object = count_rows, count_objects
    try:
        yield counts
    finally:
        dist.all_gather_into_tensor, dist.all_gather_object = rows, objects


@contextlib.contextmanager
def env_on(here: bool, name: str, value: str):
    """`name`=`value` in this process's environment while inside, where `here` is true (the
    ranks that set it); the variable's earlier value afterwards."""
    saved = os.environ.get(name)
    if here:
        os.environ[name] = value
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = saved


# -- the mismatches (P > 1) ----------------------------------------------------------------------


def forgotten_seq_splits(group, pg, r, P):
    rows = [2 + k for k in range(P)]  # rank k holds 2 + k rows
    x = seeded((1, rows[r], 2 * P, 8), r)
    for entry in (group.all_to_all_single_4d, group.all_to_all_single_4d_borrowed):
        text = refused_everywhere(
            pg,
            lambda: entry(x, 0, "q"),
            "differs across ranks",
            f"rank 0 called {entry.__name__}(x=(1, 2, {2 * P}, 8)",
            f"but rank 1 called {entry.__name__}(x=(1, 3, {2 * P}, 8)",
            f"the resolved seq_splits ({[2] * P} on rank 0, {[3] * P} on rank 1)",
            "seq_splits=None means an even split",
        )
        assert "head_splits (" not in text, text
    inputs = [seeded((1, rows[k], 2 * P, 8), k) for k in range(P)]
    got = group.all_to_all_single_4d(x, 0, "q", seq_splits=rows)
    assert same_bits(got, fu.simulate(inputs, 0, seq_splits=rows)[r])
    agreed(group, 10)


def head_splits_one_rank(group, pg, r, P):
    mine = [3, 1] if P == 2 else [3, 2, 1]
    x = seeded((1, 2, 2 * P, 8), r)
    refused_everywhere(
        pg,
        lambda: group.all_to_all_single_4d(x, 0, "q", head_splits=mine if r == 0 else None),
        "differs across ranks",
        f"head_splits={mine}",
        "head_splits=None",
        f"the resolved head_splits ({mine} on rank 0, {[2] * P} on rank 1)",
        "head_splits=None means an even split",
    )
    agreed(group, 20)


def mode_differs(group, pg, r, P):
    x = seeded((1, 2 * P, 2 * P, 8), r)
    mode = fu.Mode.HEAD_TO_SEQ if r == 0 else 0
    refused_everywhere(
        pg,
        lambda: group.all_to_all_single_4d(x, mode, "q"),
        "differs across ranks",
        "rank 0 called",
        "mode=1",
        "but rank 1 called",
        "mode=0",
        "they differ in mode (1 on rank 0, 0 on rank 1)",
    )
    agreed(group, 30)


def tag_differs(group, pg, r, P):
    x = seeded((1, 2, 2 * P, 8), r)
    last = P - 1
    agreed(group, 40)
    tags = group.stats()["tags"]
    text = refused_everywhere(
        pg,
        lambda: group.all_to_all_single_4d(x, 0, "k" if r == last else "q"),
        "differs across ranks",
        "tag='q'",
        f"but rank {last} called",
        "tag='k'",
    )
    assert text.endswith(": they differ in tag"), text
    assert group.stats()["tags"] == tags, "a refused call used a tag"
    agreed(group, 41)


def layout_differs(group, pg, r, P):
    x = seeded((2, 2, 2 * P, 8), r)  # bshd: b=2, s=2; sbhd: s=2, b=2
    text = refused_everywhere(
        pg,
        lambda: group.all_to_all_single_4d(x, 0, "q", layout="sbhd" if r == 0 else "bshd"),
        "differs across ranks",
        "layout='sbhd'",
        "layout='bshd'",
    )
    assert text.endswith(": they differ in layout"), text
    agreed(group, 50)


def invalid_one_rank(group, pg, r, P):
    last = P - 1
    x = seeded((1, 2, 2 * P + (r == last), 8), r)  # the last rank: heads P does not divide
    try:
        fu.plan(P, last, 0, (1, 2, 2 * P + 1, 8), "bf16")
    except ValueError as error:
        plan_says = str(error)
    else:
        raise AssertionError("the plan accepted the bad call")
    refused_everywhere(
        pg,
        lambda: group.all_to_all_single_4d(x, 0, "q"),
        "was refused on every rank",
        f"rank {last} called all_to_all_single_4d(x=(1, 2, {2 * P + 1}, 8)",
        f"which is invalid: {plan_says}",
        f"rank 0 called all_to_all_single_4d(x=(1, 2, {2 * P}, 8)",
    )
    agreed(group, 60)
    good = seeded((1, 2, 2 * P, 8), r)
    refused_everywhere(
        pg,
        lambda: group.all_to_all_single_4d(good, 0, "" if r == last else "q"),
        f"rank {last} called",
        "which is invalid: tag is '': a tag must be a non-empty str",
    )
    agreed(group, 61)
    grad = good.float().requires_grad_(r == 0)
    refused_everywhere(
        pg,
        lambda: group.all_to_all_single_4d_borrowed(grad, 0, "q"),
        "rank 0 called all_to_all_single_4d_borrowed(",
        "which is invalid",
        "requires grad",
        "rank 1 called",
    )
    agreed(group, 62)


def other_fields(group, pg, r, P):
    x = seeded((1, 2, 2 * P, 8), r)
    refused_everywhere(
        pg,
        lambda: group.all_to_all_single_4d(x if r else x.to(torch.float16), 0, "q"),
        "differs across ranks",
        "torch.float16",
        "torch.bfloat16",
        ": they differ in dtype",
    )
    refused_everywhere(
        pg,
        lambda: group.all_to_all_single_4d_borrowed(x, 0, "b", barrier=r != 0),
        "barrier=False",
        "barrier=True",
        ": they differ in barrier (False on rank 0, True on rank 1)",
    )
    entry = group.all_to_all_single_4d if r == 0 else group.all_to_all_single_4d_borrowed
    refused_everywhere(
        pg,
        lambda: entry(x, 0, "q"),
        "rank 0 called all_to_all_single_4d(",
        "but rank 1 called all_to_all_single_4d_borrowed(",
        ": they differ in entry point",
    )
    assert group.stats()["deferred"] == 0, "a refused barrier=False call deferred its tag"
    wide = seeded((2, 2, 2 * P, 8) if r == 0 else (1, 2, 2 * P, 16), r)  # one window size
    refused_everywhere(
        pg,
        lambda: group.all_to_all_single_4d(wide, 0, "q"),
        ": they differ in batch (2 on rank 0, 1 on rank 1), head_dim (8 on rank 0, 16 on rank 1)",
    )
    agreed(group, 70)


# `Call` with one field more, which no check reads by name: what a field added to it later is.
Extended = collections.namedtuple("Extended", (*Call._fields, "novel"))


def unnamed_field(group, pg, r, P):
    x = seeded((1, 2, 2 * P, 8), r)

    def call(novel):
        return Extended(OWNED, x, 0, "q", None, None, "bshd", None, None, novel)

    with env_on(True, "FAST_ULYSSES_DEBUG", "1"):
        debugged = fu.TorchUlyssesGroup(pg)
    for which, checked in (("call check", group), ("debug check", debugged)):
        text = refused_everywhere(
            pg,
            lambda checked=checked: checked._checked(call(r == 0)),
            "differs across ranks",
            "novel=True",
            "novel=False",
            same=which == "call check",
        )
        if which == "call check":
            assert ": they differ in other arguments" in text, text
        tag, p = checked._checked(call(7))  # alike on every rank: it goes ahead
        assert (tag, p.mode) == ("q", 0), f"{which}: {tag!r}, {p}"
    debugged.destroy()
    agreed(group, 75)


def every_rank_invalid(group, pg, r, P):
    """Every rank's own check refuses its call: each rank raises its own plan message (the
    one a single rank gives), after the one gather; no rank waits."""
    x = seeded((1, 2, 2 * P, 8), r)
    splits = [3] * P  # every rank holds 2 rows, not 3
    want = None
    try:
        fu.plan(P, r, 0, x.shape, x.dtype, seq_splits=splits)
    except ValueError as error:
        want = str(error)
    assert want and f"seq_splits[{r}]=3" in want, want
    for entry in (group.all_to_all_single_4d, group.all_to_all_single_4d_borrowed):
        with counting() as counts:
            text = refused_everywhere(pg, lambda: entry(x, 0, "q", seq_splits=splits), same=False)
        assert text == want, f"{text!r} != {want!r}"
        assert counts == {"rows": 1, "objects": 0}, counts
    agreed(group, 80)


def device_differs(group, pg, r, P):
    """A rank whose x is on another device type would send nothing (meta) or wait in the
    transport: every rank raises instead, before anything is sent, and the group still works."""
    last = P - 1
    x = seeded((1, 2, 2 * P, 8), r)
    rule = "x is on meta: this group's process group moves tensors on cpu or cuda only"
    mine = x.to("meta") if r == last else x
    out = torch.empty((1, 2 * P, 2, 8), dtype=x.dtype, device=mine.device)
    calls = {
        "owned": lambda: group.all_to_all_single_4d(mine, 0, "q"),
        "borrowed": lambda: group.all_to_all_single_4d_borrowed(mine, 0, "q"),
        "out=": lambda: group.all_to_all_single_4d(mine, 0, "q", out=out),
    }
    for name, call in calls.items():
        text = refused_everywhere(
            pg, call, "was refused on every rank", f"rank {last} called", "which is invalid"
        )
        assert rule in text, f"{name}: {text}"
        agreed(group, 90)
    meta = x.to("meta")
    text = refused_everywhere(pg, lambda: group.all_to_all_single_4d(meta, 0, "q"), same=False)
    assert text.startswith(rule), f"every rank on meta: {text}"
    agreed(group, 91)
    types = group._device_types
    group._device_types = types | {"meta"}  # every rank takes meta: only the row tells them apart
    try:
        refused_everywhere(
            pg,
            lambda: group.all_to_all_single_4d(mine, 0, "q"),
            "differs across ranks",
            ") on cpu but rank",
            ") on meta: they differ in device",
        )
    finally:
        group._device_types = types
    agreed(group, 92)


# -- the switch (P > 1) --------------------------------------------------------------------------


def check_gathers(group, pg, r, P):
    x = seeded((1, 2, 2 * P, 8), r, torch.float32)
    inputs = [seeded((1, 2, 2 * P, 8), k, torch.float32) for k in range(P)]
    want = fu.simulate(inputs, 0)[r]
    with counting() as counts:
        assert same_bits(group.all_to_all_single_4d(x, 0, "q"), want)
        assert same_bits(group.all_to_all_single_4d_borrowed(x, 0, "b"), want)
    assert counts == {"rows": 2, "objects": 0}, counts
    leaf = x.clone().requires_grad_(True)
    with counting() as counts:
        y = group.all_to_all_single_4d(leaf, 0, "g")
        (y * 2).sum().backward()  # the backward: a mode-1 call on tag "g:grad"
    assert counts == {"rows": 2, "objects": 0}, counts
    assert torch.equal(leaf.grad, torch.full_like(x, 2.0))
    with env_on(True, CHECK_ENV, "0"):
        unchecked = fu.TorchUlyssesGroup(pg)
    with counting() as counts:
        assert same_bits(unchecked.all_to_all_single_4d(x, 0, "q"), want)
        assert same_bits(unchecked.all_to_all_single_4d_borrowed(x, 0, "b"), want)
    assert counts == {"rows": 0, "objects": 0}, counts
    unchecked.destroy()


def switch_disagrees(group, pg, r, P):
    last = P - 1
    ranks = "rank 0" if P == 2 else "ranks 0, 1"
    with env_on(r == last, CHECK_ENV, "0"):
        for build in (lambda: fu.TorchUlyssesGroup(pg), lambda: fu.make_group(pg, prefer="torch")):
            refused_everywhere(
                pg,
                build,
                f"{CHECK_ENV}=0 on rank {last} but not on {ranks}: set it the same on every rank",
            )
    with env_on(r == last, CHECK_ENV, "maybe"):
        refused_everywhere(
            pg, lambda: fu.TorchUlyssesGroup(pg), f"rank {last}: {CHECK_ENV}=maybe: must be 1"
        )
    with env_on(True, CHECK_ENV, "0"):
        fu.TorchUlyssesGroup(pg).destroy()  # set alike everywhere: fine
    agreed(group, 90)


def debug_replaces_check(group, pg, r, P):
    with env_on(True, "FAST_ULYSSES_DEBUG", "1"):
        debugged = fu.TorchUlyssesGroup(pg)
    x = seeded((1, 2, 2 * P, 8), r)
    with counting() as counts:
        agreed(debugged, 100)
    assert counts == {"rows": 0, "objects": 1}, counts
    out = torch.empty(1, 2 * P, 2, 8, dtype=torch.bfloat16 if r else torch.float16)
    refused_everywhere(
        pg,
        lambda: debugged.all_to_all_single_4d(x, 0, "q", out=out),
        "call #2: rank 0 called all_to_all_single_4d(",
        "which is invalid",
        "out has dtype torch.float16 but x has torch.bfloat16",
    )
    wide = seeded((2, 2, 2 * P, 8) if r == 0 else (1, 2, 2 * P, 16), r)  # one window size
    refused_everywhere(
        pg,
        lambda: debugged.all_to_all_single_4d(wide, 0, "q"),
        "call #3 differs across ranks",
        "x=(2, 2,",
        "x=(1, 2,",
        same=False,
    )
    agreed(debugged, 101)
    debugged.destroy()


# -- out= (every P) ------------------------------------------------------------------------------


def out_cases(P: int):
    """(mode, layout, b, seq_splits, head_splits, dtype): both modes, every layout, b = 1 and 2,
    even and uneven (zero-row) splits."""
    uneven = ([0] + [3] * (P - 1), [1] * (P - 1) + [3]) if P > 1 else ([3], [4])
    for mode in (0, 1):
        for layout, b in (("bshd", 1), ("bshd", 2), ("sbhd", 1), ("sbhd", 2), ("bhsd", 2)):
            yield mode, layout, b, None, None, torch.bfloat16
        yield mode, "bshd", 2, *uneven, torch.float32
        yield mode, "bshd", 1, *uneven, torch.float32


def out_bit_exact(group, pg, r, P):
    for k, (mode, layout, b, seq, heads, dtype) in enumerate(out_cases(P)):
        seq_full, heads_full = seq or [2] * P, heads or [2] * P
        inputs = [
            seeded(
                input_shape(
                    P,
                    j,
                    mode,
                    batch=b,
                    head_dim=8,
                    seq_splits=seq_full,
                    head_splits=heads_full,
                    layout=layout,
                ),
                1000 * k + j,
                dtype,
            )
            for j in range(P)
        ]
        kw = dict(seq_splits=seq, head_splits=heads, layout=layout)
        want = fu.simulate(inputs, mode, **kw)[r]
        out = torch.full(want.shape, float("nan"), dtype=dtype)
        got = group.all_to_all_single_4d(inputs[r], mode, "o", out=out, **kw)
        case = f"mode={mode} {layout} b={b} seq={seq} heads={heads} {dtype}"
        assert got is out, case
        assert same_bits(out, want), case
        assert same_bits(group.all_to_all_single_4d(inputs[r], mode, "o", **kw), out), case
    x = seeded((1, 2, 2 * P, 8), r, torch.float32).requires_grad_(True)
    out = torch.empty(1, 2 * P, 2, 8)
    with torch.no_grad():  # each rank chooses for itself whether to pass out=
        got = group.all_to_all_single_4d(x, 0, "o", out=out if r == 0 else None)
        assert (got is out) == (r == 0) and torch.equal(got, group.all_to_all_single_4d(x, 0, "o"))
    with torch.no_grad():  # no autograd: out= is fine on an input that requires grad
        assert group.all_to_all_single_4d(x, 0, "o", out=out) is out


def out_refused(group, pg, r, P):
    last = P - 1
    x = seeded((1, 2, 2 * P, 8), r)
    shape = (1, 2 * P, 2, 8)
    backing = torch.empty(2 * x.numel(), dtype=x.dtype)
    in_backing = backing[: x.numel()].view(x.shape).copy_(x)
    grad_x = x.float().requires_grad_(True)
    cases = [  # (name, x, bad out, message)
        (
            "dtype",
            x,
            torch.empty(shape, dtype=torch.float16),
            "out has dtype torch.float16 but x has torch.bfloat16: out must have x's dtype",
        ),
        (
            "shape",
            x,
            torch.empty(1, 2 * P, 3, 8, dtype=x.dtype),
            f"out has shape [1, {2 * P}, 3, 8] but the call's output is [1, {2 * P}, 2, 8]: out "
            "must have the output's shape",
        ),
        (
            "device",
            x,
            torch.empty(shape, dtype=x.dtype, device="meta"),
            "out is on meta but x is on cpu: out must be on x's device",
        ),
        (
            "non-contiguous",
            x,
            torch.empty(1, 2, 2 * P, 8, dtype=x.dtype).transpose(1, 2),
            f"out (shape [1, {2 * P}, 2, 8], strides [{32 * P}, 8, {16 * P}, 1]) is not "
            "contiguous: out must be a contiguous tensor",
        ),
        (
            "overlap",
            in_backing,
            backing[x.numel() // 2 :][: x.numel()].view(shape),
            "out overlaps x in memory: the call reads x while it writes out; pass an out that "
            "shares no bytes with x",
        ),
        (
            "x requires grad",
            grad_x,
            torch.empty(shape),
            "out= with an input that requires grad: out= records no backward; call without out= "
            "when gradients are needed",
        ),
        (
            "out requires grad",
            x.float(),
            torch.empty(shape, requires_grad=True),
            "out= with an out that requires grad: out= records no backward; call without out= "
            "when gradients are needed",
        ),
        ("not a tensor", x, [0.0], "out is a list: it must be a torch.Tensor (or None)"),
    ]
    for name, xin, bad, message in cases:
        # The other ranks' calls are valid; their out must stay as it was: nothing was sent.
        good = torch.full(shape, -7.0, dtype=xin.dtype)
        mine, out = (xin, bad) if r == last else (xin.detach().clone(), good)
        if P == 1:
            text = refused_everywhere(
                pg, lambda: group.all_to_all_single_4d(mine, 0, "o", out=out), same=False
            )
            assert text == message, f"{name}: {text!r} != {message!r}"
        else:
            refused_everywhere(
                pg,
                lambda: group.all_to_all_single_4d(mine, 0, "o", out=out),
                "was refused on every rank",
                f"rank {last} called",
                "which is invalid: " + message,
            )
            if r != last:
                assert torch.equal(good, torch.full(shape, -7.0, dtype=xin.dtype)), name
        agreed(group, 200)
    out = torch.empty(shape, dtype=x.dtype)
    assert group.all_to_all_single_4d(x, 0, "o", out=out) is out


CHECKS = {name: globals()[name] for name in MISMATCH_CHECKS + SWITCH_CHECKS + OUT_CHECKS}


def main() -> int:
    only = set(sys.argv[1:])  # checks to run, "<check>" or "<check>_P<p>" (default: all)

    def body(report, pg, P, _device):
        group = fu.TorchUlyssesGroup(pg)
        rank = group.rank
        names = OUT_CHECKS if P == 1 else MISMATCH_CHECKS + SWITCH_CHECKS + OUT_CHECKS
        for name in names:
            if only and name not in only and f"{name}_P{P}" not in only:
                continue
            with report.check(f"{name}_P{P}"):
                CHECKS[name](group, pg, rank, P)
        group.destroy()

    return run_on_subgroups(False, body, timeout_s=60)


if __name__ == "__main__":
    sys.exit(main())
