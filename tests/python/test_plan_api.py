"""fast_ulysses.plan / simulate: the GPU-free Python face of the C++ plan."""

from __future__ import annotations

import itertools

import pytest
import torch

import fast_ulysses as fu
from fast_ulysses.plan import LAYOUTS, input_shape, limits


# (sequence dim, head dim) of each layout, written here from docs/API.md (not from the plan).
DIMS = {"bshd": (1, 2), "sbhd": (0, 2), "bhsd": (2, 1)}


def reference(inputs, mode, seq_splits, head_splits, layout):
    """All-to-all from the definition, with torch.cat / torch.split (not the plan)."""
    seq_dim, head_dim = DIMS[layout]
    if mode == 0:
        full = torch.cat(inputs, dim=seq_dim)                 # all rows, all heads
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


@pytest.mark.parametrize("P,layout,mode", list(itertools.product(
    [1, 2, 3, 5, 8], ["bshd", "sbhd", "bhsd"], [0, 1])))
def test_simulate_matches_definition(P, layout, mode):
    seq = [(2 * r + 1) % 4 for r in range(P)]
    seq[0] += 1
    heads = [1 + (r % 2) for r in range(P)]
    xs = make_inputs(P, mode, seq, heads, 2, 16, torch.bfloat16, layout)
    got = fu.simulate(xs, mode, seq_splits=seq, head_splits=heads, layout=layout)
    want = reference(xs, mode, seq, heads, layout)
    assert all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("layout,dtype,d", list(itertools.product(
    ["bshd", "sbhd", "bhsd"], [torch.float32, torch.float16, torch.int8], [1, 3])))
def test_simulate_rows_of_any_width(layout, dtype, d):
    """Rows narrower than 16 bytes, and of odd widths: fp32 with d = 1 is the softmax LSE
    (b, S, H, 1) of hybrid Ulysses + Ring. Bit-exact with the definition, both modes."""
    P, seq, heads = 3, [2, 0, 3], [1, 2, 2]
    for mode in (0, 1):
        xs = make_inputs(P, mode, seq, heads, 2, d, dtype, layout, seed=d)
        got = fu.simulate(xs, mode, seq_splits=seq, head_splits=heads, layout=layout)
        want = reference(xs, mode, seq, heads, layout)
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                   for a, b in zip(got, want))


def test_input_shape_is_the_plans():
    for layout in ("bshd", "sbhd", "bhsd"):
        for mode in (0, 1):
            shape = input_shape(3, 1, mode, batch=2, head_dim=1, seq_splits=[2, 5, 0],
                                head_splits=[1, 2, 4], layout=layout)
            p = fu.plan(3, 1, mode, shape, torch.float32, seq_splits=[2, 5, 0],
                        head_splits=[1, 2, 4], layout=layout)
            assert p.input_shape == shape
    assert input_shape(3, 1, 0, batch=2, head_dim=1, seq_splits=[2, 5, 0],
                       head_splits=[1, 2, 4], layout="bhsd") == (2, 7, 5, 1)
    with pytest.raises(ValueError, match=r"rank=3: must be in \[0, world_size=3\)"):
        input_shape(3, 3, 0, batch=1, head_dim=8, seq_splits=[1] * 3, head_splits=[1] * 3)


def test_limits_and_layouts_come_from_the_plan():
    assert LAYOUTS == ("bshd", "sbhd", "bhsd")
    got = limits()
    assert got == {"max_world_size": 8, "max_bytes": 2 ** 50, "copy_engine_alignment": 16,
                   "max_tags": 256}
    with pytest.raises(ValueError, match=r"world_size=9: must be in \[1, 8\]"):
        fu.plan(got["max_world_size"] + 1, 0, 0, (1, 4, 8, 64), torch.bfloat16)


@pytest.mark.parametrize("world_size,rank,message", [
    (2 ** 32 + 2, 0, r"world_size=4294967298: must be in \[1, 8\]"),
    (2, 2 ** 32, r"rank=4294967296: must be in \[0, world_size=2\)"),
])
def test_sizes_past_int_are_refused_not_narrowed(world_size, rank, message):
    """2^32 + 2 ranks must not plan as 2 ranks, nor rank 2^32 as rank 0 (int64 -> int)."""
    with pytest.raises(ValueError, match=message):
        fu.plan(world_size, rank, 0, (1, 4, 8, 64), torch.bfloat16)
    with pytest.raises(ValueError, match=message):
        torch.ops.fast_ulysses.shapes(world_size, rank, 0, 1, 64, [4, 4], [4, 4])
    with pytest.raises(ValueError, match=message):
        torch.ops.fast_ulysses.check_group(world_size, rank)


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
    """The C++ names its descriptor columns (op descriptor_fields); the Python CopyDescriptor has
    exactly those fields and is built by name, so a column order changed on one side cannot
    silently swap two values on the other."""
    import dataclasses

    columns = torch.ops.fast_ulysses.descriptor_fields()
    assert sorted(columns) == sorted(f.name for f in dataclasses.fields(fu.CopyDescriptor))
    p = fu.plan(2, 1, 0, (2, 3, 4, 8), torch.float32)
    assert [d.peer for d in p] == [0, 1]
    d = p[0]  # rank 1 sends its 2 heads of 3 rows to rank 0, per batch element
    assert (d.width, d.height, d.depth) == (2 * 8 * 4, 3, 2)
    assert (d.src_pitch, d.dst_pitch) == (4 * 8 * 4, 2 * 8 * 4)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(world_size=9, rank=0, mode=0, shape=(1, 4, 8, 64)), "world_size=9"),
    (dict(world_size=2, rank=2, mode=0, shape=(1, 4, 8, 64)), "rank=2"),
    (dict(world_size=2, rank=0, mode=3, shape=(1, 4, 8, 64)), "mode=3"),
    (dict(world_size=8, rank=0, mode=0, shape=(1, 4, 12, 64)), "pass head_splits"),
    (dict(world_size=2, rank=0, mode=0, shape=(1, 4, 8)), "4 dimensions"),
    (dict(world_size=2, rank=0, mode=0, shape=(1, 4, 8, 64), layout="bsdh"),
     "layout='bsdh': must be 'bshd', 'sbhd' or 'bhsd'"),
    (dict(world_size=2, rank=0, mode=0, shape=(1, 4, 8, 64), seq_splits=[5, 4]), "seq_splits[0]=5"),
    (dict(world_size=2, rank=0, mode=0, shape=(1, 4, 8, 64), head_splits=[4, 3]), "sums to 7"),
])
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
