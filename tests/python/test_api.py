"""The API both groups share: Mode and the tag and mode rules (fast_ulysses.arguments), the
UlyssesGroupLike protocol (fast_ulysses.factory), repr and stats, dtype names in plan();
UlyssesGroup's Python side is exercised without a GPU by replacing the ops it calls with a
recorder."""

from __future__ import annotations

import inspect

import numpy as np
import pytest
import torch

import fast_ulysses as fu
from fast_ulysses import group as group_module
from fast_ulysses import group_checks
from fast_ulysses._ops import _C
from fast_ulysses.arguments import as_mode, as_pool_bytes, as_splits, check_tag
from fast_ulysses.factory import UlyssesGroupLike
from fast_ulysses.group import UlyssesGroup
from fast_ulysses.torch_group import TorchUlyssesGroup
from fast_ulysses.validation import CallSpec


def protocol_members():
    """(method names, attribute names) UlyssesGroupLike declares."""
    methods = [
        n
        for n, v in vars(UlyssesGroupLike).items()
        if inspect.isfunction(v) and not n.startswith("_")
    ]
    return methods, list(UlyssesGroupLike.__annotations__)


class RecordingOps:
    """Stands in for torch.ops.fast_ulysses in group.py, and for the CUDA module whose `owned`
    and `borrowed` reach the same ops (csrc/ops/fast_entry.cpp): records each call's arguments
    under the op's name. With `decline`, the module's functions return NotImplemented (as they
    do for what they were not built for), recorded as ("declined", args)."""

    def __init__(self):
        self.calls = []
        self.below_autograd = []  # per op call: whether it ran with autograd's keys excluded
        self.decline = False

    def owned(self, *args):
        return self._module_call(self.all_to_all_single_4d, args)

    def borrowed(self, *args):
        return self._module_call(self.all_to_all_single_4d_borrowed, args)

    def owned_out(self, *args):
        return self._module_call(lambda *a: self.all_to_all_single_4d_out(*a[:-1], out=a[-1]), args)

    def _module_call(self, op, args):
        if self.decline:
            self.calls.append(("declined", args))
            return NotImplemented
        return op(*args)

    def all_to_all_single_4d(self, *args):
        return self._record("all_to_all_single_4d", args, args[0])

    def all_to_all_single_4d_borrowed(self, *args):
        return self._record("all_to_all_single_4d_borrowed", args, args[0])

    def all_to_all_single_4d_out(self, *args, out):
        return self._record("all_to_all_single_4d_out", args + (out,), out)

    def _record(self, name, args, result):
        self.calls.append((name, args))
        self.below_autograd.append(
            torch._C._dispatch_tls_is_dispatch_key_excluded(
                torch._C.DispatchKey.AutogradFunctionality
            )
        )
        return result

    refuse_device = False  # what the C++ device rule (it needs a CUDA group) answers

    def check_device(self, group_name, x):
        self.calls.append(("check_device", (group_name, x)))
        if self.refuse_device:
            raise ValueError(f"the group's device rule refused x on {x.device}")

    def group_stats(self, group_name):  # what the C++ op returns on a fresh group
        names = list(_C.GROUP_STATS_KEYS)  # GPU-free: the C++ list itself
        return names, [0] * len(names)


@pytest.fixture
def fast_group(monkeypatch, world1):
    """A UlyssesGroup on the one-rank gloo world whose ops are a RecordingOps, built without
    __init__ (which needs a GPU); its device is the CPU so that its tensor checks pass."""
    recorder = RecordingOps()
    monkeypatch.setattr(group_module, "ops", recorder)
    monkeypatch.setattr(group_checks, "ops", recorder)  # (the per-call device check's)
    monkeypatch.setattr(group_module, "cuda_module", recorder)
    g = object.__new__(UlyssesGroup)
    g.process_group, g.group_name = world1, world1.group_name
    g.rank, g.world_size, g.device = 0, 1, torch.device("cpu")
    g._debug, g._calls, g._destroyed = False, 0, False
    g.recorder = recorder
    return g


def test_mode_values():
    assert (fu.Mode.SEQ_TO_HEAD, fu.Mode.HEAD_TO_SEQ) == (0, 1)
    assert [type(as_mode(m)) for m in (fu.Mode.HEAD_TO_SEQ, 1)] == [int, int]


@pytest.mark.parametrize("mode", ["0", 0.0, None, True])
def test_mode_that_is_not_an_int_is_refused(mode):
    with pytest.raises(ValueError, match=r"^mode is .*: it must be an int, 0 \(Mode.SEQ_TO_HEAD"):
        fu.plan(2, 0, mode, (1, 4, 2, 8), torch.float16)


def test_plan_and_simulate_take_a_mode():
    p = fu.plan(2, 0, fu.Mode.HEAD_TO_SEQ, (1, 4, 1, 8), torch.float16)
    assert p == fu.plan(2, 0, 1, (1, 4, 1, 8), torch.float16) and type(p.mode) is int
    xs = [torch.randn(1, 2, 2, 8) for _ in range(2)]
    assert all(
        torch.equal(a, b) for a, b in zip(fu.simulate(xs, fu.Mode.SEQ_TO_HEAD), fu.simulate(xs, 0))
    )


def test_the_op_takes_a_mode(world1):
    x = torch.zeros(1, 6, 4, 8, dtype=torch.bfloat16, device="meta")
    out = torch.ops.fast_ulysses.all_to_all_single_4d(
        x, fu.Mode.HEAD_TO_SEQ, "t", world1.group_name
    )
    assert tuple(out.shape) == (1, 6, 4, 8)


def test_torch_group_takes_a_mode(world1):
    x = torch.randn(2, 3, 4, 8)
    got = TorchUlyssesGroup(world1).all_to_all_single_4d(x, fu.Mode.SEQ_TO_HEAD, "t")
    assert torch.equal(got, fu.simulate([x], 0)[0])


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.parametrize("entry", ["all_to_all_single_4d", "all_to_all_single_4d_borrowed"])
def test_fast_group_passes_a_plain_int_mode_to_the_op(fast_group, entry, debug):
    fast_group._debug = debug
    x = torch.zeros(1, 2, 2, 8)
    getattr(fast_group, entry)(x, fu.Mode.HEAD_TO_SEQ, "t")
    ((name, args),) = [c for c in fast_group.recorder.calls if c[0] != "check_device"]
    assert name == entry and args[1] == 1 and type(args[1]) is int


@pytest.mark.parametrize(
    "entry,names",
    [
        ("all_to_all_single_4d", "OWNED_ARGUMENTS"),
        ("all_to_all_single_4d_borrowed", "BORROWED_ARGUMENTS"),
    ],
)
def test_fast_group_passes_the_ops_arguments_in_schema_order(fast_group, entry, names):
    """The method's argument tuple, read by the op's argument names (the one definition)."""
    x = torch.zeros(1, 2, 2, 8)
    getattr(fast_group, entry)(x, 1, "t", seq_splits=[2], head_splits=[2], layout="bshd")
    ((name, args),) = [c for c in fast_group.recorder.calls if c[0] != "check_device"]
    want = {
        "x": x,
        "mode": 1,
        "tag": "t",
        "group_name": fast_group.group_name,
        "seq_splits": [2],
        "head_splits": [2],
        "layout": "bshd",
        "barrier": True,
        "rank": 0,
    }
    assert dict(zip(getattr(_C, names), args)) == {k: want[k] for k in getattr(_C, names)}
    assert len(args) == len(getattr(_C, names))


@pytest.mark.parametrize("entry", ["all_to_all_single_4d", "all_to_all_single_4d_borrowed"])
def test_fast_group_calls_torch_ops_where_the_cuda_module_declines(fast_group, entry):
    """The CUDA module's function declines (NotImplemented): the method calls torch.ops with
    the very same arguments and returns its result."""
    fast_group.recorder.decline = True
    x = torch.zeros(1, 2, 2, 8)
    out = getattr(fast_group, entry)(x, 0, "t", seq_splits=[2], head_splits=[2])
    calls = [c for c in fast_group.recorder.calls if c[0] != "check_device"]
    assert [name for name, _ in calls] == ["declined", entry], calls
    assert calls[0][1] == calls[1][1] and out is x


@pytest.mark.parametrize(
    "entry", ["all_to_all_single_4d", "all_to_all_single_4d_borrowed", "all_to_all_single_4d_out"]
)
def test_a_declined_call_takes_the_torch_ops_route_as_it_is(fast_group, entry):
    """One route per call kind: what the typed entry declines goes through torch.ops as every
    other torch.ops call does (the op's own autograd kernel decides), never through torch.ops
    with autograd switched off by the method."""
    fast_group.recorder.decline = True
    x = torch.zeros(1, 2, 2, 8)
    if entry == "all_to_all_single_4d_out":
        out = torch.empty(1, 2, 2, 8)
        assert fast_group.all_to_all_single_4d(x, 0, "t", out=out) is out
    else:
        getattr(fast_group, entry)(x, 0, "t")
    calls = [c for c in fast_group.recorder.calls if c[0] != "check_device"]
    assert [name for name, _ in calls] == ["declined", entry], calls
    assert fast_group.recorder.below_autograd == [False]


@pytest.mark.parametrize("name", sorted(fu.DTYPE_NAMES))
def test_plan_takes_dtype_names(name):
    by_name = fu.plan(2, 0, 0, (1, 4, 2, 16), name)
    by_dtype = fu.plan(2, 0, 0, (1, 4, 2, 16), fu.DTYPE_NAMES[name])
    assert by_name == by_dtype and by_name.element_size == by_dtype.element_size


def test_dtype_names_cover_the_usual_spellings():
    want = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
        "fp32": torch.float32,
        "float32": torch.float32,
        "fp8_e4m3": torch.float8_e4m3fn,
        "float8_e4m3fn": torch.float8_e4m3fn,
        "fp8_e5m2": torch.float8_e5m2,
        "int8": torch.int8,
        "uint8": torch.uint8,
    }
    assert {k: fu.DTYPE_NAMES.get(k) for k in want} == want


@pytest.mark.parametrize("dtype", ["bf17", "torch.bfloat16", None])
def test_unknown_dtype_lists_the_names(dtype):
    with pytest.raises(ValueError) as info:
        fu.plan(2, 0, 0, (1, 4, 2, 16), dtype)
    assert f"dtype is {dtype!r}" in str(info.value)
    assert all(name in str(info.value) for name in fu.DTYPE_NAMES)


def test_call_spec_takes_dtype_names(world1):
    TorchUlyssesGroup(world1).reserve([CallSpec((1, 6, 8, 16), "fp8_e4m3", fu.Mode(0), "q")])


def tag_rule_message(tag) -> str:
    with pytest.raises(ValueError) as info:
        check_tag(tag)
    return str(info.value)


@pytest.mark.parametrize("tag", ["", 3, b"q"])
def test_tag_rule_is_one_message_everywhere(world1, fast_group, tag):
    want = tag_rule_message(tag)
    assert want == f"tag is {tag!r}: a tag must be a non-empty str"
    x = torch.zeros(1, 2, 2, 8)
    torch_group = TorchUlyssesGroup(world1)
    for group in (torch_group, fast_group):
        for entry in (group.all_to_all_single_4d, group.all_to_all_single_4d_borrowed):
            with pytest.raises(ValueError) as info:
                entry(x, 0, tag)
            assert str(info.value) == want, entry
    with pytest.raises(ValueError) as info:
        torch_group.reserve([CallSpec((1, 2, 2, 8), torch.float32, 0, tag)])
    assert str(info.value) == f"calls[0]: {want}"
    assert fast_group.recorder.calls == []  # nothing reached the op


@pytest.mark.parametrize(
    "splits,message",
    [
        ([1.0], "seq_splits[0] is 1.0: split sizes must be ints"),
        ([True], "seq_splits[0] is True: split sizes must be ints"),
        ([torch.tensor(True)], "seq_splits[0] is tensor(True): split sizes must be ints"),
        ("1", "seq_splits is '1': it must be a sequence of ints, one per rank"),
        (torch.tensor(2), "seq_splits is tensor(2): it must be a sequence of ints, one per rank"),
    ],
)
def test_splits_that_are_not_ints_are_one_error_everywhere(world1, fast_group, splits, message):
    """A float split is never cut short (4.7 -> 4) by one group and refused by the other: the
    fast group, the fallback and plan() convert splits in one place and raise its message."""
    x = torch.zeros(1, 2, 2, 8)
    for group in (TorchUlyssesGroup(world1), fast_group):
        for entry in (group.all_to_all_single_4d, group.all_to_all_single_4d_borrowed):
            with pytest.raises(ValueError) as info:
                entry(x, 0, "t", seq_splits=splits)
            assert str(info.value) == message, entry
    with pytest.raises(ValueError) as info:
        fu.plan(1, 0, 0, (1, 2, 2, 8), torch.float32, seq_splits=splits)
    assert str(info.value) == message
    assert [c for c in fast_group.recorder.calls if c[0] != "check_device"] == []


@pytest.mark.parametrize(
    "seq",
    [[2], (2,), torch.tensor([2]), np.array([2]), [np.int64(2)], [torch.tensor(2)], range(2, 3)],
)
def test_integer_splits_of_any_integer_type_reach_the_op_as_ints(fast_group, seq):
    x = torch.zeros(1, 2, 2, 8)
    fast_group.all_to_all_single_4d(x, 0, "t", seq_splits=seq, head_splits=(2,))
    ((name, args),) = [c for c in fast_group.recorder.calls if c[0] != "check_device"]
    assert args[4] == [2] and args[5] == [2] and all(type(v) is int for v in args[4] + args[5])


@pytest.mark.parametrize("value", [1e9, -1, True, "1"])
def test_pool_bytes_rule_is_one_message_for_both_groups(world1, value):
    """Both groups check the argument before anything else (UlyssesGroup before it looks for
    a GPU, so this runs on a machine without one)."""
    want = f"initial_pool_bytes is {value!r}: it must be an int >= 0"
    for cls in (TorchUlyssesGroup, UlyssesGroup):
        with pytest.raises(ValueError) as info:
            cls(world1, value)
        assert str(info.value) == want, cls


def test_pool_bytes_of_any_integer_type_are_taken():
    assert [as_pool_bytes(v) for v in (0, 5, np.int64(7), torch.tensor(9))] == [0, 5, 7, 9]


def test_tag_none_is_auto_for_owned_calls_and_refused_for_borrowed(world1, fast_group):
    x = torch.zeros(1, 2, 2, 8)
    for group in (TorchUlyssesGroup(world1), fast_group):
        with pytest.raises(ValueError, match="^tag is None: a borrowed call needs an explicit"):
            group.all_to_all_single_4d_borrowed(x, 0, None)
        group.all_to_all_single_4d(x, 0, None)
    assert [args[2] for _, args in fast_group.recorder.calls] == [fu.auto_tag(x, 0)]


def test_fast_group_debug_asks_the_ops_device_rule_before_the_call(fast_group):
    """The debug path asks the C++ device rule (the op check_device) and reports its refusal as
    the rank's invalid call; the collective is never reached. (The rule's own words are checked
    on a GPU: tests/workers/a2a_correctness.py, check debug_mode.)"""
    fast_group._debug = True
    fast_group.recorder.refuse_device = True
    with pytest.raises(ValueError) as info:
        fast_group.all_to_all_single_4d(torch.zeros(1, 2, 2, 8), 0, "q")
    assert str(info.value).startswith("call #1: rank 0 called all_to_all_single_4d(x=(1, 2, 2, 8)")
    assert "which is invalid: the group's device rule refused x on cpu" in str(info.value)
    assert [name for name, _ in fast_group.recorder.calls] == ["check_device"]


def test_torch_group_satisfies_the_protocol(world1):
    assert isinstance(TorchUlyssesGroup(world1), UlyssesGroupLike)


@pytest.mark.parametrize("cls", [UlyssesGroup, TorchUlyssesGroup])
def test_both_group_classes_have_every_protocol_member(cls):
    methods, attributes = protocol_members()
    assert set(methods) == {
        "all_to_all_single_4d",
        "all_to_all_single_4d_borrowed",
        "barrier",
        "reserve",
        "stats",
        "destroy",
    }
    assert set(attributes) == {"rank", "world_size", "fallback", "fallback_reason"}
    for name in methods:
        want = inspect.signature(getattr(UlyssesGroupLike, name)).parameters
        got = inspect.signature(getattr(cls, name)).parameters
        assert [(p.name, p.kind) for p in got.values()] == [
            (p.name, p.kind) for p in want.values()
        ], name
    for name in attributes:
        assert name in vars(cls) or name in cls.__annotations__, name


def test_reprs_have_one_shape(world1, fast_group):
    torch_group = TorchUlyssesGroup(world1)
    assert (
        repr(torch_group)
        == "TorchUlyssesGroup(rank=0, world_size=1, fallback=True, reason='requested')"
    )
    torch_group.destroy()
    assert repr(torch_group).endswith("reason='requested', destroyed=True)")
    fast_group.device = torch.device("cuda", 0)
    assert repr(fast_group) == "UlyssesGroup(rank=0, world_size=1, device=cuda:0, fallback=False)"


def test_torch_group_stats_have_the_fast_groups_keys(world1, fast_group):
    group = TorchUlyssesGroup(world1)
    assert group.stats() == {
        "pool_bytes": 0,
        "used_bytes": 0,
        "segments": 0,
        "sealed": False,
        "tags": 0,
        "deferred": 0,
        "graph_calls": 0,
        "graphs_cached": 0,
        "eager_only_signatures": 0,
        "wide_flags": 0,
    }
    assert list(group.stats()) == list(fast_group.stats())
    for tag in ("q", "k"):
        group.all_to_all_single_4d_borrowed(torch.zeros(1, 2, 2, 8), 0, tag, barrier=False)
    assert group.stats()["deferred"] == 2
    group.barrier()
    group.all_to_all_single_4d_borrowed(torch.zeros(1, 2, 2, 8), 0, "q")
    group.reserve([CallSpec((1, 2, 2, 8), torch.float32, 0, "v")])
    assert group.stats() == {
        "pool_bytes": 0,
        "used_bytes": 0,
        "segments": 0,
        "sealed": True,
        "tags": 3,
        "deferred": 0,
        "graph_calls": 0,
        "graphs_cached": 0,
        "eager_only_signatures": 0,
        "wide_flags": 0,
    }
    group.destroy()
    with pytest.raises(RuntimeError, match="destroyed"):
        group.stats()


def test_mode_and_tag_rules_trace_under_torch_compile():
    """UlyssesGroup runs them inside compiled regions: they must not break the graph."""

    def f(x):
        check_tag("q")
        seq = as_splits([2, 3], "seq_splits")
        heads = as_splits((4,), "head_splits")
        return x * as_mode(fu.Mode.HEAD_TO_SEQ) * (seq[1] + heads[0])

    compiled = torch.compile(f, fullgraph=True, backend="eager")
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 7.0))


@pytest.mark.parametrize("value", ["true", "2", "on"])
def test_a_switch_with_another_value_than_0_or_1_is_refused(world1, monkeypatch, value):
    """FAST_ULYSSES_DEBUG=true must not be read as off (nor as on): the group refuses it."""
    monkeypatch.setenv("FAST_ULYSSES_DEBUG", value)
    with pytest.raises(ValueError, match=f"FAST_ULYSSES_DEBUG={value}: must be 0 .* or 1"):
        fu.TorchUlyssesGroup(world1)
    monkeypatch.setenv("FAST_ULYSSES_DEBUG", "0")
    assert fu.TorchUlyssesGroup(world1)._debug is False
