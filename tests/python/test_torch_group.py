"""TorchUlyssesGroup on gloo (CPU): bit-exact with fast_ulysses.simulate for P = 1..8, inputs
given as strided views (a packed qkv projection's q, k or v, ...) bit-exact with the contiguous
input, and the same errors as the plan and the fast path's tensor checks.

The multi-rank part launches one 8-rank gloo world once (the P-rank groups are subgroups of it,
so the machine's 2 cores pay for 8 torch imports, not 36) with a hard timeout."""

from __future__ import annotations

import itertools
import re

import pytest
import torch
import torch.distributed._functional_collectives as funcol

import fast_ulysses
from fast_ulysses.errors import FastUlyssesError
from fast_ulysses.plan import limits
from fast_ulysses.torch_group import TorchUlyssesGroup
from fast_ulysses.validation import CallSpec, check_input, window_bytes_by_tag

WORLD = 8


@pytest.fixture(scope="module")
def eight_ranks(launch_ranks):
    # CPU ranks even where GPUs exist: the worker checks make_group's fallback for ranks without one.
    return launch_ranks("torch_group", WORLD, timeout=300, env={"CUDA_VISIBLE_DEVICES": ""})


@pytest.mark.parametrize("P", range(1, WORLD + 1))
def test_matches_simulate(eight_ranks, P):
    eight_ranks.assert_check(f"subgroup_P{P}", ranks=range(WORLD - P, WORLD))


@pytest.mark.parametrize("P", range(1, WORLD + 1))
def test_packed_views_move_as_the_contiguous_input(eight_ranks, P):
    """Every rank passes a strided view of its input (packed_views.py; its own packing): owned,
    borrowed and out= results equal the contiguous input's, bit for bit, modes 0 and 1, every
    layout."""
    eight_ranks.assert_check(f"packed_views_P{P}", ranks=range(WORLD - P, WORLD))


def test_all_ranks_exit_cleanly(eight_ranks):
    eight_ranks.assert_clean_exit()


# Each bad tensor and the message docs/API.md's rules give it: one C++ check
# (fast_ulysses._C.check_input) raises it for both groups.
BAD_TENSORS = {
    "3-d": (torch.zeros(2, 3, 8), "x has shape [2, 3, 8]: it must be 4-d (bshd, sbhd or bhsd)"),
    "bool": (
        torch.zeros(1, 2, 2, 16, dtype=torch.bool),
        "x has dtype Bool: complex and bool tensors are not supported",
    ),
    "complex": (
        torch.zeros(1, 2, 2, 8, dtype=torch.complex64),
        "x has dtype ComplexFloat: complex and bool tensors are not supported",
    ),
    "float64": (
        torch.zeros(1, 2, 2, 8, dtype=torch.float64),
        "x has dtype Double of 8 bytes: element size must be 1, 2 or 4 bytes (float16 "
        "and bfloat16 are the main ones)",
    ),
    "int64": (
        torch.zeros(1, 2, 2, 8, dtype=torch.int64),
        "x has dtype Long of 8 bytes: element size must be 1, 2 or 4 bytes (float16 "
        "and bfloat16 are the main ones)",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_TENSORS))
def test_bad_tensor_gives_the_documented_message_on_both_groups(world1, name):
    """The fast group's kernels (reached here through the Meta kernel) and TorchUlyssesGroup
    run the one C++ check, and both raise its message, whole."""
    x, message = BAD_TENSORS[name]
    exact = "^" + re.escape(message) + "$"
    with pytest.raises(ValueError, match=exact):
        torch.ops.fast_ulysses.all_to_all_single_4d(x.to("meta"), 0, "t", world1.group_name)
    with pytest.raises(ValueError, match=exact):
        TorchUlyssesGroup(world1).all_to_all_single_4d(x, 0, "t")
    with pytest.raises(ValueError, match=exact):
        check_input(x)


STRIDED = {
    "transposed": torch.zeros(1, 4, 2, 8).transpose(1, 2),
    "qkv narrow": torch.zeros(2, 3, 12, 8).narrow(2, 4, 4),
    "expanded": torch.zeros(1, 3, 4, 8).expand(2, 3, 4, 8),
}


@pytest.mark.parametrize("name", sorted(STRIDED))
def test_strided_inputs_pass_the_tensor_check_and_the_meta_kernel(world1, name):
    """Strided inputs are no bad tensors: `check_input` takes them, and the Meta kernel (what
    torch.compile traces) gives the contiguous input's output shape."""
    x = STRIDED[name]
    assert not x.is_contiguous() and check_input(x) == 4
    meta = torch.empty_strided(x.shape, x.stride(), device="meta")
    for mode in (0, 1):
        got = torch.ops.fast_ulysses.all_to_all_single_4d(meta, mode, "t", world1.group_name)
        want = torch.ops.fast_ulysses.all_to_all_single_4d(
            meta.contiguous(), mode, "t", world1.group_name
        )
        assert got.shape == want.shape and got.is_contiguous()


@pytest.mark.parametrize("layout", ["bshd", "sbhd", "bhsd"])
def test_packed_views_at_one_rank_equal_the_contiguous_input(world1, layout):
    """P = 1, in process: every packing, both modes, owned, borrowed and out=."""
    import packed_views

    group = TorchUlyssesGroup(world1)
    g = torch.Generator().manual_seed(11)
    x = (torch.randn(2, 3, 4, 8, generator=g) * 50).to(torch.bfloat16)
    for mode, packing in itertools.product((0, 1), packed_views.PACKINGS):
        view = packed_views.packed(x, layout, packing)
        want = group.all_to_all_single_4d(x, mode, "t", layout=layout)
        out = torch.empty_like(want)
        for got in (
            group.all_to_all_single_4d(view, mode, "t", layout=layout),
            group.all_to_all_single_4d_borrowed(view, mode, "b", layout=layout),
            group.all_to_all_single_4d(view, mode, "t", layout=layout, out=out),
        ):
            assert torch.equal(got.view(torch.uint8), want.view(torch.uint8)), (mode, packing)


def test_more_ranks_than_one_node_raise_when_the_group_is_built(world1, monkeypatch):
    """A 9-rank group is beyond the plan's limit for both groups: the fallback raises at
    construction (make_group falls back to it for more than 8 ranks), not on every call."""
    import fast_ulysses.torch_group as torch_group

    assert TorchUlyssesGroup(world1).world_size == 1  # the real group builds
    monkeypatch.setattr(torch_group.dist, "get_world_size", lambda group=None: 9)
    for build in (TorchUlyssesGroup, fast_ulysses.make_group):  # make_group: before any gather
        with pytest.raises(ValueError, match=r"^world_size=9: must be in \[1, 8\] \(one node\)$"):
            build(world1)


@pytest.mark.parametrize("name", ["bool", "complex", "float64", "int64"])
def test_plan_refuses_a_bad_dtype_with_the_groups_message(name):
    """plan() and simulate() take a dtype the groups refuse no more than the groups do, and
    state the groups' rule in the same words (one C++ check), naming what the caller passed:
    plan's dtype argument as torch spells it, simulate's inputs (neither has an `x`)."""
    x, message = BAD_TENSORS[name]
    rule = re.escape(message.partition(": ")[2])
    size = rf" \({x.element_size()}-byte elements\)" if "element size" in message else ""
    dtype = re.escape(str(x.dtype))
    with pytest.raises(ValueError, match=f"^dtype={dtype}{size}: {rule}$"):
        fast_ulysses.plan(1, 0, 0, (1, 2, 2, 8), x.dtype)
    with pytest.raises(ValueError, match=f"^inputs\\[0\\] has dtype {dtype}{size}: {rule}$"):
        fast_ulysses.simulate([x.contiguous()], 0)


def test_check_input_returns_the_element_size():
    for dtype, size in [(torch.int8, 1), (torch.bfloat16, 2), (torch.float32, 4)]:
        assert check_input(torch.zeros(1, 2, 3, 1, dtype=dtype)) == size
        assert check_input(torch.zeros(1, 2, 3, 1, dtype=dtype, device="meta")) == size
    with pytest.raises(ValueError, match="^x is a list: it must be a torch.Tensor$"):
        check_input([1, 2])


@pytest.mark.parametrize(
    "dtype,d",
    [
        (torch.float8_e4m3fn, 16),
        (torch.int8, 16),
        (torch.int32, 4),
        (torch.float16, 8),
        (torch.float32, 1),
        (torch.float16, 3),
        (torch.int8, 5),
    ],
)
def test_other_dtypes_and_row_widths_are_bit_exact(world1, dtype, d):
    g = torch.Generator().manual_seed(7)
    x = torch.randint(-100, 100, (2, 3, 4, d), generator=g).to(dtype)
    group = TorchUlyssesGroup(world1)
    for layout in ("bshd", "sbhd", "bhsd"):
        out = group.all_to_all_single_4d(x, 0, "t", layout=layout)
        want = fast_ulysses.simulate([x], 0, layout=layout)[0]
        assert torch.equal(out.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize(
    "layout,shape", [("sbhd", (3, 2, 4, 8)), ("bshd", (1, 3, 4, 8)), ("bshd", (2, 3, 4, 8))]
)
def test_results_are_plain_waited_tensors(world1, layout, shape):
    """No AsyncCollectiveTensor comes back, even where no relayout follows the collective
    (sbhd mode 0, bshd mode 0 with b == 1): the result has waited, like UlyssesGroup's."""
    group = TorchUlyssesGroup(world1)
    for entry in (group.all_to_all_single_4d, group.all_to_all_single_4d_borrowed):
        out = entry(torch.ones(shape), 0, "t", layout=layout)
        assert not isinstance(out, funcol.AsyncCollectiveTensor), type(out)
        assert out.is_contiguous() and torch.equal(out, torch.ones(shape))


def test_group_attributes_and_lifetime(world1):
    group = TorchUlyssesGroup(world1, initial_pool_bytes=1 << 20)
    assert (group.rank, group.world_size, group.process_group) == (0, 1, world1)
    assert group.fallback is True and group.fallback_reason == "requested"
    assert TorchUlyssesGroup().process_group is world1  # None: the default group
    group.destroy()
    # It lets go of the process group, so that destroy_process_group() frees the group while
    # the interpreter is alive (a gloo group still referenced at exit can abort the process).
    assert group.process_group is None, "destroy() kept its process group"
    group.destroy()  # a second destroy is harmless
    with pytest.raises(RuntimeError, match="destroyed"):
        group.all_to_all_single_4d(torch.ones(1, 2, 2, 8), 0, "t")
    with pytest.raises(RuntimeError, match="destroyed"):
        group.barrier()


def test_bad_constructor_arguments(world1):
    with pytest.raises(ValueError, match="initial_pool_bytes"):
        TorchUlyssesGroup(world1, initial_pool_bytes=-1)
    with pytest.raises(ValueError, match="tag"):
        TorchUlyssesGroup(world1).all_to_all_single_4d(torch.ones(1, 2, 2, 8), 0, 3)


def test_window_bytes_by_tag_is_the_largest_plan_per_tag():
    heads = (2, 2, 2, 2, 1, 1, 1, 1)  # Wan 1.3B: 12 heads on 8 ranks
    calls = [
        CallSpec((1, 6, 12, 128), torch.bfloat16, 0, "q", head_splits=heads),
        CallSpec((1, 9, 12, 128), torch.bfloat16, 0, "q", head_splits=heads),
        CallSpec((1, 72, 2, 128), torch.bfloat16, 1, "o"),
    ]
    got = window_bytes_by_tag(calls, 8, 0)
    want = {}
    for c in calls:
        p = fast_ulysses.plan(8, 0, c.mode, c.shape, c.dtype, head_splits=c.head_splits)
        want[c.tag] = max(want.get(c.tag, 0), p.window_bytes)
    assert got == want and list(got) == ["q", "o"]


def test_window_bytes_by_tag_takes_every_layout_and_narrow_rows():
    """A bhsd call and an fp32 d = 1 call (the LSE) size their windows as the plan says."""
    calls = [
        CallSpec((2, 12, 6, 64), torch.bfloat16, 0, "q", layout="bhsd"),
        CallSpec((2, 6, 12, 1), torch.float32, 0, "lse"),
    ]
    got = window_bytes_by_tag(calls, 4, 1)
    assert got == {"q": 2 * 3 * 24 * 64 * 2, "lse": 2 * 24 * 3 * 1 * 4}
    for c in calls:
        assert (
            got[c.tag] == fast_ulysses.plan(4, 1, 0, c.shape, c.dtype, layout=c.layout).window_bytes
        )


@pytest.mark.parametrize(
    "call,message",
    [
        (CallSpec((1, 6, 12, 128), torch.bfloat16, 0, "q"), r"calls\[0\] \(tag 'q'\): .*divide"),
        (CallSpec((1, 6, 8, 128), torch.float64, 0, "q"), r"calls\[0\] .*element size"),
        (CallSpec((1, 6, 8, 128), torch.bfloat16, 0, ""), r"calls\[0\]: tag is '': a tag must"),
        (CallSpec((1, 6, 8, 128), torch.bfloat16, 0, 7), r"calls\[0\]: tag is 7: a tag must"),
        (CallSpec((1, 6, 8, 128), "bf17", 0, "q"), r"calls\[0\] .*dtype is 'bf17'.*bf16"),
        ((1, 6, 8, 128), r"calls\[0\] is a tuple"),
    ],
)
def test_window_bytes_by_tag_rejects_bad_calls(call, message):
    with pytest.raises(ValueError, match=message):
        window_bytes_by_tag([call], 8, 0)


def test_reserve_checks_calls(world1):
    group = TorchUlyssesGroup(world1)
    group.reserve([CallSpec((1, 6, 8, 128), torch.bfloat16, 0, "q")])
    with pytest.raises(ValueError, match="element size"):
        group.reserve([CallSpec((1, 6, 8, 128), torch.float64, 0, "q")])


def test_reserve_takes_dicts_as_call_specs(world1):
    """A dict with CallSpec's field names declares the same call as the CallSpec; both kinds
    mix in one reserve()."""
    calls = [
        {"tag": "q", "shape": (1, 6, 8, 16), "mode": 0, "dtype": "fp32"},
        {
            "tag": "o",
            "shape": (8, 2, 6, 16),
            "mode": fast_ulysses.Mode.HEAD_TO_SEQ,
            "dtype": torch.bfloat16,
            "seq_splits": [8],
            "head_splits": (6,),
            "layout": "sbhd",
        },
    ]
    specs = [CallSpec(**call) for call in calls]
    assert (
        window_bytes_by_tag(calls, 1, 0)
        == window_bytes_by_tag(specs, 1, 0)
        == {"q": 1 * 6 * 8 * 16 * 4, "o": 8 * 2 * 6 * 16 * 2}
    )
    group = TorchUlyssesGroup(world1)
    group.reserve(
        [
            calls[0],
            specs[1],
            {"tag": "k", "shape": [1, 6, 8, 16], "mode": 0, "dtype": torch.float32},
        ]
    )
    assert group.stats()["sealed"] is True and group.stats()["tags"] == 3
    x = torch.arange(768.0).reshape(1, 6, 8, 16)
    assert torch.equal(group.all_to_all_single_4d(x, 0, "q"), x)
    assert torch.equal(group.all_to_all_single_4d(x, 0, "k"), x)
    with pytest.raises(
        FastUlyssesError, match="needs a window of 6144 bytes but it was declared with 3072"
    ):
        group.all_to_all_single_4d(torch.ones(8, 2, 6, 16), 1, "o", layout="sbhd")


GOOD = {"tag": "q", "shape": (1, 6, 8, 128), "mode": 0, "dtype": "bf16"}


@pytest.mark.parametrize(
    "call,message",
    [
        (
            {k: v for k, v in GOOD.items() if k != "dtype"},
            r"^calls\[1\] has no key 'dtype': a call dict needs tag, shape, mode, dtype \(and may "
            r"have seq_splits, head_splits, layout\)$",
        ),
        ({k: v for k, v in GOOD.items() if k != "tag"}, r"^calls\[1\] has no key 'tag'"),
        (
            dict(GOOD, layuot="bshd"),
            r"^calls\[1\] has the unknown key 'layuot': a call dict takes tag, shape, mode, dtype, "
            r"seq_splits, head_splits, layout$",
        ),
        ({**GOOD, 1: 2}, r"^calls\[1\] has the unknown key 1: "),
        (dict(GOOD, mode=2), r"^calls\[1\] \(tag 'q'\): mode"),
        (dict(GOOD, tag=""), r"^calls\[1\]: tag is '': a tag must"),
        (
            [1, 6, 8, 128],
            r"^calls\[1\] is a list: reserve takes fast_ulysses.CallSpec values, or "
            r"dicts with the keys tag, shape, mode, dtype",
        ),
    ],
)
def test_reserve_refuses_bad_call_dicts_naming_the_call_and_key(world1, call, message):
    """reserve() and window_bytes_by_tag (shared by both groups) refuse a bad dict with
    FastUlyssesError naming calls[index] and the key; a refused reserve() seals nothing."""
    with pytest.raises(FastUlyssesError, match=message):
        window_bytes_by_tag([GOOD, call], 8, 0)
    group = TorchUlyssesGroup(world1)
    with pytest.raises(FastUlyssesError, match=message):
        group.reserve([dict(GOOD, shape=(1, 6, 1, 128)), call])
    assert group.stats()["sealed"] is False and group.stats()["tags"] == 0


def test_every_refusal_of_the_fallback_is_a_fast_ulysses_error(world1, monkeypatch):
    """Refusals raised in C++ (the tensor rule, the plan, the tag rules, the borrowed grad
    rule: plain ValueErrors there) and in Python, and the use of a destroyed group, reach the
    caller as FastUlyssesError (so `except ValueError` and `except RuntimeError` catch them)."""
    group = TorchUlyssesGroup(world1)
    x = torch.ones(1, 2, 2, 8)
    group.all_to_all_single_4d_borrowed(x, 0, "deferred", barrier=False)
    refusals = {
        "tensor": lambda: group.all_to_all_single_4d(torch.ones(2, 3, 8), 0, "t"),
        "plan": lambda: group.all_to_all_single_4d(x, 0, "t", head_splits=[3]),
        "layout": lambda: group.all_to_all_single_4d_borrowed(x, 0, "t", layout="bsdh"),
        "mode": lambda: group.all_to_all_single_4d(x, 2, "t"),
        "deferred tag": lambda: group.all_to_all_single_4d(x, 0, "deferred"),
        "borrowed grad": lambda: group.all_to_all_single_4d_borrowed(
            x.clone().requires_grad_(True), 0, "t"
        ),
        "out": lambda: group.all_to_all_single_4d(x, 0, "t", out=torch.ones(1, 2, 2, 4)),
        "reserve": lambda: group.reserve([CallSpec((1, 2, 3, 8), "fp64", 0, "t")]),
    }
    for name, refusal in refusals.items():
        with pytest.raises(ValueError) as info:
            refusal()
        assert type(info.value) is FastUlyssesError, f"{name}: {info.value!r}"
    group.barrier()
    group.reserve([CallSpec((1, 2, 2, 8), torch.float32, 0, "t")])
    with pytest.raises(FastUlyssesError, match="not declared and the pool is sealed"):
        group.all_to_all_single_4d(x, 0, "undeclared")
    group.destroy()
    for use in (
        lambda: group.all_to_all_single_4d(x, 0, "t"),
        group.barrier,
        group.stats,
        lambda: group.all_to_all_single_4d_borrowed(x, 0, "t"),
        lambda: group.reserve([]),
    ):
        with pytest.raises(FastUlyssesError, match="destroyed") as info:
            use()
        assert isinstance(info.value, RuntimeError)
    import fast_ulysses.torch_group as torch_group

    monkeypatch.setattr(torch_group.dist, "get_world_size", lambda group=None: 9)
    with pytest.raises(FastUlyssesError, match=r"^world_size=9: must be in \[1, 8\]"):
        TorchUlyssesGroup(world1)


def test_out_fills_the_callers_tensor_at_one_rank(world1):
    """At P = 1 too: out= is filled and returned, bit-exact; an out that is x itself (the
    output has x's shape at P = 1) is refused as overlapping, before anything is written."""
    group = TorchUlyssesGroup(world1)
    x = torch.randn(2, 3, 4, 8).to(torch.bfloat16)
    for mode, layout in ((0, "bshd"), (1, "bshd"), (0, "sbhd"), (1, "bhsd")):
        out = torch.full_like(x, float("nan"))
        assert group.all_to_all_single_4d(x, mode, "o", layout=layout, out=out) is out
        assert torch.equal(out.view(torch.int16), x.view(torch.int16))
    with pytest.raises(FastUlyssesError, match="^out overlaps x in memory"):
        group.all_to_all_single_4d(x, 0, "o", out=x)


# The fast group's per-tag rules hold on the fallback too (one C++ definition, csrc/plan/
# tag_rules.h): a program that breaks one must fail in a CPU test, not first on the GPU.


def test_reserve_seals_the_group_as_on_the_fast_group(world1):
    group = TorchUlyssesGroup(world1)
    x = torch.ones(1, 6, 8, 16)
    group.all_to_all_single_4d(x, 0, "early")  # a tag used before reserve() keeps its window
    assert group.stats()["sealed"] is False
    group.reserve([CallSpec((1, 6, 8, 16), torch.float32, 0, "q")])
    assert group.stats()["sealed"] is True and group.stats()["tags"] == 2
    assert torch.equal(group.all_to_all_single_4d(x, 0, "q"), x)  # declared
    assert torch.equal(group.all_to_all_single_4d(x[:, :3].contiguous(), 0, "q"), x[:, :3])
    assert torch.equal(group.all_to_all_single_4d_borrowed(x, 0, "early"), x)
    with pytest.raises(
        ValueError,
        match=r"tag 'z' needs a window of 3072 bytes but it was not "
        r"declared and the pool is sealed by reserve\(\)",
    ):
        group.all_to_all_single_4d(x, 0, "z")
    with pytest.raises(
        ValueError,
        match=r"tag 'q' needs a window of 6144 bytes but it was "
        r"declared with 3072 .*declare this call in reserve",
    ):
        group.all_to_all_single_4d_borrowed(torch.ones(1, 12, 8, 16), 0, "q")
    group.reserve([CallSpec((1, 12, 8, 16), torch.float32, 0, "q")])  # declared larger now
    assert group.all_to_all_single_4d(torch.ones(1, 12, 8, 16), 0, "q").shape == (1, 12, 8, 16)


def test_deferred_tag_refused_until_barrier(world1):
    group = TorchUlyssesGroup(world1)
    x = torch.arange(48.0).reshape(1, 3, 4, 4)
    for t in ("q", "k"):
        assert torch.equal(group.all_to_all_single_4d_borrowed(x, 0, t, barrier=False), x)
    assert group.stats()["deferred"] == 2
    assert torch.equal(group.all_to_all_single_4d_borrowed(x, 0, "v"), x)  # another tag: fine
    for entry in (group.all_to_all_single_4d, group.all_to_all_single_4d_borrowed):
        with pytest.raises(
            ValueError,
            match=r"tag 'q' was last used with barrier=False and "
            r"group.barrier\(\) has not run since",
        ):
            entry(x, 0, "q")
    group.barrier()
    assert group.stats()["deferred"] == 0
    assert torch.equal(group.all_to_all_single_4d(x, 0, "q"), x)


def test_tag_limit_as_on_the_fast_group(world1):
    group = TorchUlyssesGroup(world1)
    x = torch.ones(1, 1, 1, 4)
    limit = limits()["max_tags"]
    assert limit == 256
    for k in range(limit):
        group.all_to_all_single_4d(x, 0, f"t{k}")
    group.all_to_all_single_4d(x, 0, "t0")  # a known tag is always fine
    with pytest.raises(
        ValueError,
        match=r"tag 'one more' would be the group's tag number 257: "
        r"at most 256 distinct tags per group",
    ):
        group.all_to_all_single_4d(x, 0, "one more")
    with pytest.raises(ValueError, match="at most 256 distinct tags"):
        group.reserve([CallSpec((1, 1, 1, 4), torch.float32, 0, "declared")])
    assert group.stats()["tags"] == limit


@pytest.mark.parametrize("op", ["all_to_all_single_4d", "all_to_all_single_4d_borrowed"])
def test_meta_kernel_takes_the_rank_and_refuses_another(world1, op):
    """The op's `rank` argument (what keeps compiled graphs of different ranks apart) must be
    this process's rank: the Meta kernel gives the plan's shape for it and refuses another."""
    fn = getattr(torch.ops.fast_ulysses, op)
    x = torch.zeros(1, 6, 4, 8, dtype=torch.bfloat16, device="meta")
    out = fn(x, 0, "t", world1.group_name, None, None, "bshd", rank=0)
    assert tuple(out.shape) == (1, 6, 4, 8)
    with pytest.raises(ValueError, match=r"rank=1 but this process is rank 0"):
        fn(x, 0, "t", world1.group_name, None, None, "bshd", rank=1)


@pytest.mark.parametrize(
    "backend",
    ["aot_eager", pytest.param("inductor", marks=pytest.mark.full)],  # (a C++ build)
)
def test_torch_compile_runs_the_fallback_like_eager(world1, backend):
    """torch.compile of a TorchUlyssesGroup call (planning stays outside the trace: its ops take
    no tensors) gives eager's result and gradient."""
    group = TorchUlyssesGroup(world1)
    x = torch.randn(1, 6, 4, 8, requires_grad=True)

    def step(t):
        return group.all_to_all_single_4d(t, 0, "compiled", layout="bshd") * 2

    try:
        got = torch.compile(step, backend=backend)(x)
        (got * torch.arange(got.numel()).view(got.shape)).sum().backward()
        grad, x.grad = x.grad, None
        want = step(x)
        (want * torch.arange(want.numel()).view(want.shape)).sum().backward()
        assert torch.equal(got, want) and torch.equal(grad, x.grad)
    finally:
        group.destroy()


# -- argument rules of the fallback (each one a refusal, never wrong data or a hang) -------------


@pytest.fixture(scope="module")
def two_ranks_device_check(launch_ranks):
    """The call check's device rule on 2 gloo CPU ranks, alone (tests/workers/call_check.py's
    device_differs): a rank left waiting in the transport fails the launch at its timeout."""
    return launch_ranks(
        "call_check",
        2,
        "device_differs",
        timeout=60,
        env={
            "CUDA_VISIBLE_DEVICES": "",
            "FAST_ULYSSES_CHECK_CALLS": None,
            "FAST_ULYSSES_DEBUG": None,
        },
    )


def test_a_meta_input_on_one_rank_is_refused_on_every_rank(two_ranks_device_check):
    two_ranks_device_check.assert_check("device_differs_P2", ranks=range(2))
    two_ranks_device_check.assert_clean_exit()


def test_a_meta_input_is_refused_naming_its_device(world1):
    """A meta tensor holds no data: both entry points refuse it (with out= too) instead of
    returning a meta tensor with nothing moved."""
    group = TorchUlyssesGroup(world1)
    meta = torch.ones(1, 2, 2, 8).to("meta")
    rule = (
        "x is on meta: this group's process group moves tensors on cpu or cuda only (a meta "
        "tensor holds no data to send)"
    )
    for call in (
        lambda: group.all_to_all_single_4d(meta, 0, "t"),
        lambda: group.all_to_all_single_4d_borrowed(meta, 0, "t"),
        lambda: group.all_to_all_single_4d(meta, 0, "t", out=torch.empty_like(meta)),
    ):
        with pytest.raises(FastUlyssesError, match="^" + re.escape(rule) + "$"):
            call()
    with pytest.raises(FastUlyssesError, match="^out is on meta but x is on cpu"):
        group.all_to_all_single_4d(torch.ones(1, 2, 2, 8), 0, "t", out=meta)
    assert group.stats()["tags"] == 0, "a refused call used up a tag"


@pytest.mark.parametrize("calls", [None, 3, "calls", CallSpec((1, 2, 2, 8), "fp32", 0, "r"), GOOD])
def test_reserve_refuses_calls_that_are_not_a_list(world1, calls):
    """reserve() (both groups: window_bytes_by_tag) takes a list of calls; one call, None or a
    number is refused naming `calls`, not a TypeError from iterating it."""
    message = rf"^calls is {re.escape(repr(calls))}: it must be a list of fast_ulysses.CallSpec"
    with pytest.raises(FastUlyssesError, match=message):
        window_bytes_by_tag(calls, 1, 0)
    group = TorchUlyssesGroup(world1)
    with pytest.raises(FastUlyssesError, match=message):
        group.reserve(calls)
    assert group.stats()["sealed"] is False


def test_reserve_names_a_shape_that_is_not_a_sequence(world1):
    with pytest.raises(
        FastUlyssesError,
        match=r"^calls\[0\] \(tag 'r'\): shape is None: it must be a sequence of 4 ints",
    ):
        TorchUlyssesGroup(world1).reserve([CallSpec(None, "fp32", 0, "r")])


def test_a_reserve_refused_at_the_tag_limit_declares_no_tag(world1):
    """A reserve() that would pass the tag limit records none of its tags and seals nothing: the
    group's remaining tag slots stay free, and a smaller reserve() still works."""
    group = TorchUlyssesGroup(world1)
    x = torch.ones(1, 1, 1, 4)
    limit = limits()["max_tags"]
    for k in range(limit - 6):
        group.all_to_all_single_4d(x, 0, f"t{k}")
    declared = [CallSpec((1, 1, 1, 4), torch.float32, 0, f"r{k}") for k in range(10)]
    with pytest.raises(
        FastUlyssesError, match=f"tag 'r6' would be the group's tag number {limit + 1}"
    ):
        group.reserve(declared)
    assert group.stats()["tags"] == limit - 6 and group.stats()["sealed"] is False
    group.all_to_all_single_4d(x, 0, "new")  # a slot the refused reserve() did not take
    group.reserve(declared[:5])
    assert group.stats()["tags"] == limit and group.stats()["sealed"] is True


@pytest.mark.parametrize("barrier", [None, 0, 1, [], "no"])
def test_barrier_must_be_a_bool_on_both_groups(world1, barrier):
    """barrier=None, 0 or [] would defer and "no" would not: both borrowed entry points refuse
    anything but True or False, before anything is sent."""
    from fast_ulysses.group import UlyssesGroup

    message = f"^barrier is {re.escape(repr(barrier))}: it must be True or False$"
    group = TorchUlyssesGroup(world1)
    x = torch.ones(1, 2, 2, 8)
    with pytest.raises(FastUlyssesError, match=message):
        group.all_to_all_single_4d_borrowed(x, 0, "t", barrier=barrier)
    assert group.stats()["deferred"] == 0 and group.stats()["tags"] == 0
    # The fast group checks it before it touches the group (no GPU needed to reach the check).
    with pytest.raises(FastUlyssesError, match=message):
        UlyssesGroup.all_to_all_single_4d_borrowed(
            object.__new__(UlyssesGroup), x, 0, "t", barrier=barrier
        )


@pytest.mark.parametrize("debug", ["0", "1"])
def test_splits_from_a_generator_reach_the_backward(world1, monkeypatch, debug):
    """Splits given as one-shot iterables are read once: the forward and the backward (and the
    debug check, FAST_ULYSSES_DEBUG=1) all see the same values."""
    monkeypatch.setenv("FAST_ULYSSES_DEBUG", debug)
    group = TorchUlyssesGroup(world1)
    x = torch.arange(64.0).reshape(1, 2, 4, 8).requires_grad_(True)
    y = group.all_to_all_single_4d(x, 0, "g", seq_splits=iter([2]), head_splits=(h for h in [4]))
    assert torch.equal(y, x)
    (y * 3).sum().backward()
    assert torch.equal(x.grad, torch.full_like(x, 3.0))


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (
            {"process_group": [0]},
            r"^process_group is \[0\]: it must be a torch.distributed ProcessGroup, or None",
        ),
        ({"decision": "x"}, r"^decision is 'x': it must be a fast_ulysses.topology.Decision"),
    ],
)
def test_constructor_refuses_a_bad_process_group_or_decision(world1, kwargs, message):
    with pytest.raises(FastUlyssesError, match=message):
        TorchUlyssesGroup(**kwargs)
