"""The CUDA module's `owned` and `borrowed` (csrc/ops/fast_entry.cpp), UlyssesGroup's eager way
into its ops, on CPU and meta tensors: they reach the same op through the dispatcher (the same
errors and shapes as torch.ops, dispatch modes and the profiler see the op), and
decline with NotImplemented whatever they were not built for. A call that needs a gradient goes
through the op's C++ Autograd kernel; every other one below autograd."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from fast_ulysses._ops import _C, cuda_load_error, cuda_module

pytestmark = pytest.mark.skipif(cuda_module is None, reason=f"no CUDA part: {cuda_load_error}")

OPS = {
    "owned": torch.ops.fast_ulysses.all_to_all_single_4d,
    "borrowed": torch.ops.fast_ulysses.all_to_all_single_4d_borrowed,
}
ENTRIES = sorted(OPS)


def arguments(entry: str, x=None, group_name: str = "no-such-group", **change) -> list:
    """The arguments UlyssesGroup's method passes, in the op's order (the names `_C` exports
    from the one definition); `change` replaces some by name."""
    named = {
        "x": torch.zeros(1, 4, 2, 8) if x is None else x,
        "mode": 0,
        "tag": "q",
        "group_name": group_name,
        "seq_splits": None,
        "head_splits": None,
        "layout": "bshd",
        "barrier": True,
        "rank": 0,
    }
    named.update(change)
    order = _C.BORROWED_ARGUMENTS if entry == "borrowed" else _C.OWNED_ARGUMENTS
    return [named[name] for name in order]


def error_of(call, args) -> tuple:
    with pytest.raises(Exception) as info:
        call(*args)
    return type(info.value), str(info.value)


@pytest.mark.parametrize("entry", ENTRIES)
def test_raises_what_torch_ops_raises(entry):
    """No UlyssesGroup for the name: the op's own ValueError, word for word."""
    args = arguments(entry)
    got = error_of(getattr(cuda_module, entry), args)
    assert got == error_of(OPS[entry], args) and got[0] is ValueError, got


@pytest.mark.parametrize("entry", ENTRIES)
def test_meta_tensor_gets_the_meta_kernels_shape(entry, world1):
    x = torch.zeros(1, 6, 4, 8, dtype=torch.bfloat16, device="meta")
    args = arguments(entry, x, world1.group_name, mode=1)
    got, want = getattr(cuda_module, entry)(*args), OPS[entry](*args)
    assert got.device.type == "meta" and got.shape == want.shape == (1, 6, 4, 8)


@pytest.mark.parametrize("entry", ENTRIES)
def test_a_dispatch_mode_sees_the_op(entry):
    """Through the dispatcher: a TorchDispatchMode gets the op's overload and its result is the
    call's."""
    seen = []

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func)
            return torch.full((3,), 7.0)

    args = arguments(entry)
    with Recording():
        out = getattr(cuda_module, entry)(*args)
    assert seen == [OPS[entry].default] and torch.equal(out, torch.full((3,), 7.0))


@pytest.mark.parametrize("entry", ENTRIES)
def test_the_profiler_records_the_op(entry):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with pytest.raises(ValueError, match="no UlyssesGroup"):
            getattr(cuda_module, entry)(*arguments(entry))
    names = {event.name for event in prof.events()}
    assert OPS[entry].default.name() in names, sorted(names)


def test_an_owned_call_that_needs_a_gradient_records_the_ops_backward(world1):
    """A call whose x requires grad (grad mode on) goes through the op's C++ Autograd kernel:
    its result records the backward (mode 1 - m, which runs on meta too); with grad mode off,
    or an x that needs none, it records nothing."""
    x = torch.zeros(1, 4, 2, 8, device="meta", requires_grad=True)
    y = cuda_module.owned(*arguments("owned", x, world1.group_name))
    assert y.requires_grad and y.grad_fn is not None and y.shape == (1, 4, 2, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape
    with torch.no_grad():
        assert cuda_module.owned(*arguments("owned", x, world1.group_name)).grad_fn is None
    plain = cuda_module.owned(*arguments("owned", x.detach(), world1.group_name))
    assert plain.grad_fn is None and not plain.requires_grad


def test_a_borrowed_call_that_needs_a_gradient_is_refused_by_its_autograd_kernel(world1):
    x = torch.zeros(1, 4, 2, 8, device="meta", requires_grad=True)
    with pytest.raises(ValueError, match="all_to_all_single_4d_borrowed: x requires grad"):
        cuda_module.borrowed(*arguments("borrowed", x, world1.group_name))


class Subclass(torch.Tensor):
    pass


DECLINED = {
    "a tensor subclass": dict(x=torch.zeros(1, 4, 2, 8).as_subclass(Subclass)),
    "a bool mode": dict(mode=True),
    "a bytes tag": dict(tag=b"q"),
    "a tuple of splits": dict(seq_splits=(2, 2)),
    "a float split": dict(head_splits=[2.0]),
    "a rank past int64": dict(rank=2**70),
}


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("what", sorted(DECLINED))
def test_declines_what_it_was_not_built_for(entry, what):
    assert getattr(cuda_module, entry)(*arguments(entry, **DECLINED[what])) is NotImplemented


def test_borrowed_declines_a_barrier_that_is_not_a_bool():
    assert cuda_module.borrowed(*arguments("borrowed", barrier=1)) is NotImplemented


@pytest.mark.parametrize("entry", ENTRIES)
def test_declines_another_number_of_arguments(entry):
    assert getattr(cuda_module, entry)(*arguments(entry)[:-1]) is NotImplemented


@pytest.mark.parametrize("entry", ENTRIES)
def test_declines_under_a_torch_function_mode(entry):
    class Passing(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    with Passing():
        assert getattr(cuda_module, entry)(*arguments(entry)) is NotImplemented


def test_owned_out_fills_and_checks_out_on_meta(world1):
    """owned_out reaches the out= op: its Meta kernel returns `out` itself and refuses an out of
    the wrong shape or dtype, or a non-contiguous one, as torch.ops does (ValueError)."""
    x = torch.zeros(1, 6, 4, 8, dtype=torch.bfloat16, device="meta")
    args = arguments("owned", x, world1.group_name)
    out = torch.empty(1, 6, 4, 8, dtype=torch.bfloat16, device="meta")
    assert cuda_module.owned_out(*args, out) is out
    op = torch.ops.fast_ulysses.all_to_all_single_4d_out
    for bad, needle in (
        (torch.empty(1, 6, 4, 9, dtype=torch.bfloat16, device="meta"), "shape"),
        (torch.empty(1, 6, 4, 8, dtype=torch.float16, device="meta"), "dtype"),
        (
            torch.empty(1, 4, 6, 8, dtype=torch.bfloat16, device="meta").transpose(1, 2),
            "contiguous",
        ),
    ):
        got = error_of(cuda_module.owned_out, [*args, bad])
        assert got[0] is ValueError and needle in got[1], got
        assert got == error_of(lambda *a: op(*a[:-1], out=a[-1]), [*args, bad]), got


def test_owned_out_declines_what_it_was_not_built_for():
    args = arguments("owned")
    assert cuda_module.owned_out(*args, [1]) is NotImplemented  # out not a tensor
    assert cuda_module.owned_out(*args) is NotImplemented  # no out
