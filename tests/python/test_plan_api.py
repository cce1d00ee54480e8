"""fast_ulysses.plan / simulate: the GPU-free Python face of the C++ plan."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

import fast_ulysses as fu
from fast_ulysses._ops import _C
from fast_ulysses.plan import LAYOUTS, input_shape, limits

# (sequence dim, head dim) of each layout, written here from docs/API.md (not from the plan).
DIMS = {"bshd": (1, 2), "sbhd": (0, 2), "bhsd": (2, 1)}


def reference(inputs, mode, seq_splits, head_splits, layout):
    """All-to-all from the definition, with torch.cat / torch.split (not the plan)."""
    seq_dim, head_dim = DIMS[layout]
    if mode == 0:
        full = torch.cat(inputs, dim=seq_dim)  # all rows, all heads
        return list(torch.split(full, head_splits, dim=head_dim))
    full = torch.cat(inputs, dim=head_dim)
    return list(torch.split(full, seq_splits, dim=seq_dim))


def make_inputs(P, mode, seq, heads, b, d, dtype, layout, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    seq_dim, head_dim = DIMS[layout]
    for r in range(P):
        s, n = (seq[r], sum(heads)) if mode == 0 else (sum(seq), heads[r])
        shape = [b, b, b, d]
        shape[seq_dim], shape[head_dim] = s, n
        out.append((torch.randn(shape, generator=g) * 3).to(dtype))
    return out


@pytest.mark.parametrize(
    "P,layout,mode", list(itertools.product([1, 2, 3, 5, 8], ["bshd", "sbhd", "bhsd"], [0, 1]))
)
def test_simulate_matches_definition(P, layout, mode):
    seq = [(2 * r + 1) % 4 for r in range(P)]
    seq[0] += 1
    heads = [1 + (r % 2) for r in range(P)]
    xs = make_inputs(P, mode, seq, heads, 2, 16, torch.bfloat16, layout)
    got = fu.simulate(xs, mode, seq_splits=seq, head_splits=heads, layout=layout)
    want = reference(xs, mode, seq, heads, layout)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize(
    "layout,dtype,d",
    list(
        itertools.product(
            ["bshd", "sbhd", "bhsd"], [torch.float32, torch.float16, torch.int8], [1, 3]
        )
    ),
)
def test_simulate_rows_of_any_width(layout, dtype, d):
    """Rows narrower than 16 bytes, and of odd widths: fp32 with d = 1 is the softmax LSE
    (b, S, H, 1) of hybrid Ulysses + Ring. Bit-exact with the definition, both modes."""
    P, seq, heads = 3, [2, 0, 3], [1, 2, 2]
    for mode in (0, 1):
        xs = make_inputs(P, mode, seq, heads, 2, d, dtype, layout, seed=d)
        got = fu.simulate(xs, mode, seq_splits=seq, head_splits=heads, layout=layout)
        want = reference(xs, mode, seq, heads, layout)
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(got, want))


def test_input_shape_is_the_plans():
    for layout in ("bshd", "sbhd", "bhsd"):
        for mode in (0, 1):
            shape = input_shape(
                3,
                1,
                mode,
                batch=2,
                head_dim=1,
                seq_splits=[2, 5, 0],
                head_splits=[1, 2, 4],
                layout=layout,
            )
            p = fu.plan(
                3,
                1,
                mode,
                shape,
                torch.float32,
                seq_splits=[2, 5, 0],
                head_splits=[1, 2, 4],
                layout=layout,
            )
            assert p.input_shape == shape
    assert input_shape(
        3, 1, 0, batch=2, head_dim=1, seq_splits=[2, 5, 0], head_splits=[1, 2, 4], layout="bhsd"
    ) == (2, 7, 5, 1)
    with pytest.raises(ValueError, match=r"rank=3: must be in \[0, world_size=3\)"):
        input_shape(3, 3, 0, batch=1, head_dim=8, seq_splits=[1] * 3, head_splits=[1] * 3)


def test_limits_and_layouts_come_from_the_plan():
    assert LAYOUTS == ("bshd", "sbhd", "bhsd")
    got = limits()
    assert got == {
        "max_world_size": 8,
        "max_bytes": 2**50,
        "copy_engine_alignment": 16,
        "max_tags": 256,
    }
    with pytest.raises(ValueError, match=r"world_size=9: must be in \[1, 8\]"):
        fu.plan(got["max_world_size"] + 1, 0, 0, (1, 4, 8, 64), torch.bfloat16)


@pytest.mark.parametrize(
    "world_size,rank,message",
    [
        (2**32 + 2, 0, r"world_size=4294967298: must be in \[1, 8\]"),
        (2, 2**32, r"rank=4294967296: must be in \[0, world_size=2\)"),
    ],
)
def test_sizes_past_int_are_refused_not_narrowed(world_size, rank, message):
    """2^32 + 2 ranks must not plan as 2 ranks, nor rank 2^32 as rank 0 (int64 -> int)."""
    with pytest.raises(ValueError, match=message):
        fu.plan(world_size, rank, 0, (1, 4, 8, 64), torch.bfloat16)
    with pytest.raises(ValueError, match=message):
        _C.shapes(world_size, rank, 0, 1, 64, [4, 4], [4, 4], "bshd")
    with pytest.raises(ValueError, match=message):
        _C.check_group(world_size, rank)


def test_round_trip_fp16_even():
    xs = make_inputs(4, 0, [6] * 4, [2] * 4, 1, 64, torch.float16, "bshd")
    mid = fu.simulate(xs, 0)
    back = fu.simulate(mid, 1)
    assert all(torch.equal(a, b) for a, b in zip(back, xs))


def test_wan_720p_plan_bytes():
    p = fu.plan(8, 0, 0, (1, 9450, 40, 128), torch.bfloat16)
    assert [d.bytes for d in p] == [12_096_000] * 8
    assert p.output_shape == (1, 75_600, 5, 128)
    assert p.window_bytes == 96_768_000
    assert p[3].src_pitch == 40 * 128 * 2 and p[3].width == 5 * 128 * 2
    assert p.remote_bytes == 7 * 12_096_000


def test_plan_descriptor_fields_cross_by_name():
    """The C++ names its descriptor columns (_C.DESCRIPTOR_FIELDS); the Python CopyDescriptor has
    exactly those fields and is built by name, so a column order changed on one side cannot
    silently swap two values on the other."""
    import dataclasses

    columns = _C.DESCRIPTOR_FIELDS
    assert sorted(columns) == sorted(f.name for f in dataclasses.fields(fu.CopyDescriptor))
    p = fu.plan(2, 1, 0, (2, 3, 4, 8), torch.float32)
    assert [d.peer for d in p] == [0, 1]
    d = p[0]  # rank 1 sends its 2 heads of 3 rows to rank 0, per batch element
    assert (d.width, d.height, d.depth) == (2 * 8 * 4, 3, 2)
    assert (d.src_pitch, d.dst_pitch) == (4 * 8 * 4, 2 * 8 * 4)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(world_size=9, rank=0, mode=0, shape=(1, 4, 8, 64)), "world_size=9"),
        (dict(world_size=2, rank=2, mode=0, shape=(1, 4, 8, 64)), "rank=2"),
        (dict(world_size=2, rank=0, mode=3, shape=(1, 4, 8, 64)), "mode=3"),
        (dict(world_size=8, rank=0, mode=0, shape=(1, 4, 12, 64)), "pass head_splits"),
        (dict(world_size=2, rank=0, mode=0, shape=(1, 4, 8)), "4 dimensions"),
        (
            dict(world_size=2, rank=0, mode=0, shape=(1, 4, 8, 64), layout="bsdh"),
            "layout='bsdh': must be 'bshd', 'sbhd' or 'bhsd'",
        ),
        (
            dict(world_size=2, rank=0, mode=0, shape=(1, 4, 8, 64), seq_splits=[5, 4]),
            "seq_splits[0]=5",
        ),
        (dict(world_size=2, rank=0, mode=0, shape=(1, 4, 8, 64), head_splits=[4, 3]), "sums to 7"),
    ],
)
def test_plan_errors_name_the_argument(kwargs, needle):
    with pytest.raises(ValueError, match=None) as info:
        fu.plan(dtype=torch.bfloat16, **kwargs)
    assert needle in str(info.value)


def test_simulate_rejects_mixed_dtypes():
    with pytest.raises(ValueError, match="dtype"):
        fu.simulate([torch.zeros(1, 2, 2, 8), torch.zeros(1, 2, 2, 8, dtype=torch.float16)], 0)


def test_zero_row_rank():
    xs = make_inputs(3, 0, [0, 3, 2], [1, 1, 1], 1, 16, torch.float16, "bshd")
    got = fu.simulate(xs, 0, seq_splits=[0, 3, 2], head_splits=[1, 1, 1])
    want = reference(xs, 0, [0, 3, 2], [1, 1, 1], "bshd")
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert fu.plan(3, 0, 0, xs[0].shape, torch.float16, seq_splits=[0, 3, 2]).total_bytes == 0


SHAPE = (1, 4, 8, 64)
BEYOND = "it must fit in int64 (-2^63 to 2^63 - 1)"


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(world_size=2.0), "world_size is 2.0: it must be an int (e.g. 2)"),
        (dict(world_size=True), "world_size is True: it must be an int, not a bool"),
        (dict(world_size="2"), "world_size is '2': it must be an int (e.g. 2)"),
        (dict(world_size=2**63), f"world_size is 9223372036854775808: {BEYOND}"),
        (dict(world_size=2**64), f"world_size is 18446744073709551616: {BEYOND}"),
        (dict(world_size=-(2**63) - 1), f"world_size is -9223372036854775809: {BEYOND}"),
        (dict(rank=0.0), "rank is 0.0: it must be an int (e.g. 0)"),
        (dict(rank=False), "rank is False: it must be an int, not a bool"),
        (dict(rank=2**63), f"rank is 9223372036854775808: {BEYOND}"),
        (dict(mode=2**63), f"mode is 9223372036854775808: {BEYOND}"),
        (dict(shape=(1, 4, 8.0, 64)), "shape[2] is 8.0: it must be an int (e.g. 8)"),
        (dict(shape=(1, 4, 8, True)), "shape[3] is True: it must be an int, not a bool"),
        (dict(shape=(1, "4", 8, 64)), "shape[1] is '4': it must be an int (e.g. 4)"),
        (dict(shape=(1, 4, 8, 2**63)), f"shape[3] is 9223372036854775808: {BEYOND}"),
        (dict(shape=(1, 2**70, 8, 64)), f"shape[1] is {2**70}: {BEYOND}"),
        (dict(shape="1,4,8,64"), "shape is '1,4,8,64': it must be a sequence of ints"),
        (dict(shape=None), "shape is None: it must be a sequence of ints"),
        (dict(dtype=2.0), "dtype is 2.0: an element size must be an int (e.g. 2)"),
        (dict(dtype=2**63), f"dtype is 9223372036854775808: {BEYOND}"),
        (dict(seq_splits=[2**63, 4]), f"seq_splits[0] is 9223372036854775808: {BEYOND}"),
        (dict(head_splits=[4, -(2**64)]), f"head_splits[1] is -18446744073709551616: {BEYOND}"),
        (dict(layout=3), "layout is 3: it must be a str, 'bshd', 'sbhd' or 'bhsd'"),
    ],
)
def test_plan_refuses_what_is_no_int64_by_name(kwargs, message):
    """Floats, bools, strings and integers past int64 are refused by argument and value as a
    FastUlyssesError, never by the op's schema (a RuntimeError) nor narrowed."""
    call = dict(world_size=2, rank=0, mode=0, shape=SHAPE, dtype=torch.bfloat16) | kwargs
    with pytest.raises(fu.errors.FastUlyssesError) as info:
        fu.plan(**call)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        (dict(world_size=9), "world_size=9: must be in [1, 8]"),
        (dict(world_size=-2), "world_size=-2: must be in [1, 8]"),
        (dict(rank=-1), "rank=-1: must be in [0, world_size=2)"),
        (dict(rank=2**63 - 1), "rank=9223372036854775807: must be in [0, world_size=2)"),
        (dict(mode=3), "mode=3"),
        (dict(shape=(1, 4, 8, -1)), "negative dimension"),
        (dict(dtype=3), "element_size=3: must be 1, 2 or 4 bytes"),
        (dict(dtype=-2), "element_size=-2"),
        (dict(seq_splits=[-1, 5]), "seq_splits[0]=-1: entries must be >= 0"),
        (dict(head_splits=[2**62, 2**62]), "head_splits[0]=4611686018427387904"),
    ],
)
def test_plan_refusals_from_cpp_reach_the_caller_as_fast_ulysses_errors(kwargs, needle):
    """The plan's own ValueErrors (negative where not allowed, out of range) arrive as
    FastUlyssesError, the package's one refusal class."""
    call = dict(world_size=2, rank=0, mode=0, shape=SHAPE, dtype=torch.bfloat16) | kwargs
    with pytest.raises(fu.errors.FastUlyssesError) as info:
        fu.plan(**call)
    assert needle in str(info.value)


@pytest.mark.parametrize(
    "dtype,message",
    [
        (
            torch.float64,
            "dtype=torch.float64 (8-byte elements): element size must be 1, 2 or 4 bytes",
        ),
        (torch.int64, "dtype=torch.int64 (8-byte elements): element size must be 1, 2 or 4"),
        (torch.bool, "dtype=torch.bool: complex and bool tensors are not supported"),
        (torch.complex64, "dtype=torch.complex64: complex and bool tensors are not supported"),
    ],
)
def test_plan_refuses_a_dtype_by_the_argument_the_caller_passed(dtype, message):
    """plan(..., torch.float64) names its dtype argument as torch spells it and the rule, not
    the `x` (and c10's "Double") of the groups' tensor check: plan() has no x."""
    with pytest.raises(fu.errors.FastUlyssesError) as info:
        fu.plan(2, 0, 0, SHAPE, dtype)
    assert str(info.value).startswith(message), str(info.value)
    assert "x has" not in str(info.value) and "Double" not in str(info.value)


def test_simulate_refuses_a_dtype_by_its_inputs():
    """simulate() has no dtype argument: it names its inputs' dtype."""
    with pytest.raises(fu.errors.FastUlyssesError) as info:
        fu.simulate([torch.zeros(1, 2, 2, 8, dtype=torch.float64)] * 2, 0)
    assert str(info.value).startswith(
        "inputs[0] has dtype torch.float64 (8-byte elements): element size must be 1, 2 or 4"
    ), str(info.value)


def test_plan_takes_any_integer_type_and_keeps_plain_ints():
    """numpy and 0-d tensor integers are integers (as everywhere in the API): the plan takes
    them, element size included, and its Plan holds plain ints."""
    import numpy as np

    p = fu.plan(np.int64(2), torch.tensor(1), 0, (np.int64(1), 4, torch.tensor(8), 64), np.int64(2))
    assert (p.world_size, p.rank, p.element_size) == (2, 1, 2)
    assert p.input_shape == SHAPE
    assert all(type(v) is int for v in (p.world_size, p.rank, p.element_size, *p.input_shape))


IS = dict(world_size=2, rank=0, mode=0, batch=1, head_dim=8, seq_splits=[1, 1], head_splits=[1, 1])


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(world_size=2.0), "world_size is 2.0: it must be an int (e.g. 2)"),
        (dict(rank=2**63), f"rank is 9223372036854775808: {BEYOND}"),
        (dict(batch=1.0), "batch is 1.0: it must be an int (e.g. 1)"),
        (dict(batch=2**63), f"batch is 9223372036854775808: {BEYOND}"),
        (dict(head_dim=True), "head_dim is True: it must be an int, not a bool"),
        (dict(head_dim="8"), "head_dim is '8': it must be an int (e.g. 8)"),
        (dict(seq_splits=[1.0, 1]), "seq_splits[0] is 1.0: split sizes must be ints"),
        (dict(head_splits=[1, 2**63]), f"head_splits[1] is 9223372036854775808: {BEYOND}"),
        (dict(seq_splits=None), "seq_splits is None: input_shape takes explicit splits"),
        (dict(batch=-1), "batch=-1: must be >= 1"),
        (dict(rank=-1), "rank=-1: must be in [0, world_size=2)"),
        (dict(mode=5), "mode=5: must be 0"),
    ],
)
def test_input_shape_refuses_by_name(kwargs, message):
    with pytest.raises(fu.errors.FastUlyssesError) as info:
        input_shape(**(IS | kwargs))
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda xs: fu.simulate(xs, 0, seq_splits=[2**63, 2]),
            f"seq_splits[0] is 9223372036854775808: {BEYOND}",
        ),
        (lambda xs: fu.simulate(xs, 2**64), f"mode is 18446744073709551616: {BEYOND}"),
        (lambda xs: fu.simulate(xs, 0, layout=0), "layout is 0: it must be"),
        (lambda xs: fu.simulate([xs[0], 2], 0), "inputs[1] is a int: it must be a torch.Tensor"),
        (lambda xs: fu.simulate(xs[0], 0), "inputs is a Tensor: it must be a sequence of tensors"),
        (
            lambda xs: fu.simulate(xs, 0, seq_splits=[-1, 5]),
            "seq_splits[0]=-1: entries must be >= 0",
        ),
        (lambda xs: fu.simulate(xs * 5, 0), "world_size=10: must be in [1, 8]"),
        (lambda xs: fu.simulate([x.double() for x in xs], 0), "element size must be 1, 2 or 4"),
    ],
)
def test_simulate_refuses_by_name(call, message):
    xs = [torch.zeros(1, 2, 2, 8), torch.zeros(1, 2, 2, 8)]
    with pytest.raises(fu.errors.FastUlyssesError) as info:
        call(xs)
    assert message in str(info.value)


ONE_CALL = (
    "ranks must agree on batch (dim {b}) and head_dim (dim 3); only dim {v} ({what}) may differ"
)


@pytest.mark.parametrize(
    "mode,layout,shapes,rule",
    [
        (0, "bshd", [(1, 2, 4, 8), (2, 2, 4, 4)], ONE_CALL.format(b=0, v=1, what="sequence")),
        (0, "bshd", [(1, 2, 4, 8), (1, 2, 4, 4)], ONE_CALL.format(b=0, v=1, what="sequence")),
        (1, "bshd", [(1, 4, 2, 8), (2, 4, 2, 8)], ONE_CALL.format(b=0, v=2, what="heads")),
        (0, "sbhd", [(2, 1, 4, 8), (2, 2, 4, 8)], ONE_CALL.format(b=1, v=0, what="sequence")),
        (1, "bhsd", [(1, 2, 4, 8), (1, 2, 4, 16)], ONE_CALL.format(b=0, v=1, what="heads")),
    ],
)
def test_simulate_refuses_ranks_that_disagree_on_batch_or_head_dim(mode, layout, shapes, rule):
    """Same element count, other batch or head_dim: before, 16 of 64 output values were read
    from window bytes no rank wrote."""
    xs = [torch.randn(shape) for shape in shapes]
    message = (
        f"inputs[1] has shape {list(shapes[1])} but inputs[0] has {list(shapes[0])}: {rule} "
        f"in mode {mode}, {layout}"
    )
    with pytest.raises(fu.errors.FastUlyssesError, match=re.escape(message) + "$"):
        fu.simulate(xs, mode, layout=layout)


@pytest.mark.parametrize(
    "mode,shapes,splits,resolved,varying",
    [  # rank 1's resolved (seq_splits, head_splits) against rank 0's
        (0, [(1, 2, 2, 8), (1, 4, 2, 8)], {}, ("[4, 4], [1, 1]", "[2, 2], [1, 1]"), "1 (sequence)"),
        (0, [(1, 2, 4, 8), (1, 2, 6, 8)], {}, ("[2, 2], [3, 3]", "[2, 2], [2, 2]"), "1 (sequence)"),
        (
            1,
            [(1, 4, 2, 8), (1, 6, 2, 8)],
            {"head_splits": [2, 2]},
            ("[3, 3], [2, 2]", "[2, 2], [2, 2]"),
            "2 (heads)",
        ),
    ],
)
def test_simulate_refuses_ranks_whose_splits_resolve_differently(
    mode, shapes, splits, resolved, varying
):
    """Uneven rows with seq_splits=None, or another total of heads (mode 0) or rows (mode 1)."""
    xs = [torch.randn(shape) for shape in shapes]
    seq, heads = resolved[0].split(", [")
    message = (
        f"inputs[1] has shape {list(shapes[1])} but inputs[0] has {list(shapes[0])}: they "
        f"resolve seq_splits={seq}, head_splits=[{heads} but inputs[0] resolves {resolved[1]}: "
        "ranks must agree on the splits (None means even: pass the splits for uneven ones); "
        f"only dim {varying} may differ in mode {mode}, bshd"
    )
    with pytest.raises(fu.errors.FastUlyssesError, match=re.escape(message) + "$"):
        fu.simulate(xs, mode, **splits)


def test_simulate_refuses_meta_inputs_by_name():
    xs = [torch.zeros(1, 2, 2, 8), torch.empty(1, 2, 2, 8, device="meta")]
    message = (
        "inputs[1] is on device meta: simulate reads the data, so every input must be on a "
        "device that can copy it to the CPU (not meta)"
    )
    with pytest.raises(fu.errors.FastUlyssesError, match=re.escape(message) + "$"):
        fu.simulate(xs, 0)
