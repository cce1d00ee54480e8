"""Autograd of both groups and the two tag rules (backward_tag, auto_tag).

Multi-rank: one 3-rank gloo launch of tests/workers/autograd.py (TorchUlyssesGroup, P = 1, 2,
3), one test per check and P. In process: the fast ops' autograd wiring on meta tensors (the CUDA
kernels themselves are exercised by tests/gpu/test_autograd_gpu.py)."""

from __future__ import annotations

import autograd as worker  # the worker's check names
import pytest
import torch

import fast_ulysses as fu
from fast_ulysses.autograd import check_borrowed_grad

WORLD = 3


@pytest.fixture(scope="module")
def ranks(launch_ranks):
    return launch_ranks("autograd", WORLD, timeout=300)


@pytest.mark.parametrize("check", worker.check_names(WORLD))
def test_worker_check(ranks, check):
    P = int(check.rsplit("_P", 1)[1])
    ranks.assert_check(check, ranks=range(WORLD - P, WORLD))


def test_all_ranks_exit_cleanly(ranks):
    ranks.assert_clean_exit()


def test_backward_tag_appends_the_suffix():
    assert fu.backward_tag("q") == "q:grad"
    assert fu.backward_tag(fu.backward_tag("q")) == "q:grad:grad"


def test_auto_tag_hides_the_rank_dependent_dimension():
    x = torch.zeros(2, 5, 12, 8, dtype=torch.bfloat16)
    assert fu.auto_tag(x, 0) == "fu.auto:m0:bshd:bfloat16:2x*x12x8"
    assert fu.auto_tag(x, 1) == "fu.auto:m1:bshd:bfloat16:2x5x*x8"
    assert fu.auto_tag(x, fu.Mode.SEQ_TO_HEAD, "sbhd") == "fu.auto:m0:sbhd:bfloat16:*x5x12x8"
    # Two ranks of one uneven call (5 and 3 sequence rows) reach one tag.
    assert fu.auto_tag(torch.zeros(2, 3, 12, 8, dtype=torch.bfloat16), 0) == fu.auto_tag(x, 0)


def op_args(world1, x, mode=0):
    return (x, mode, "t", world1.group_name, None, None, "bshd")


def test_fast_op_backward_is_the_inverse_call_on_meta(world1):
    """The registered backward runs the op in mode 1 - m: on meta tensors, the gradient of an
    uneven mode-0 call has the input's shape."""
    x = torch.zeros(1, 6, 4, 8, dtype=torch.bfloat16, device="meta", requires_grad=True)
    y = torch.ops.fast_ulysses.all_to_all_single_4d(*op_args(world1, x), rank=0)
    assert y.requires_grad and y.shape == (1, 6, 4, 8)
    y.sum().backward()
    assert x.grad.shape == x.shape and x.grad.device.type == "meta"


def test_fast_borrowed_op_refuses_grad_and_runs_without(world1):
    x = torch.zeros(1, 6, 4, 8, dtype=torch.bfloat16, device="meta", requires_grad=True)
    op = torch.ops.fast_ulysses.all_to_all_single_4d_borrowed
    with pytest.raises(ValueError, match=r"x requires grad.*call all_to_all_single_4d"):
        op(*op_args(world1, x), True, 0)
    with torch.no_grad():
        assert op(*op_args(world1, x), True, 0).shape == (1, 6, 4, 8)
    assert op(*op_args(world1, x.detach()), True, 0).requires_grad is False


def test_check_borrowed_grad_only_with_grad_mode():
    x = torch.zeros(1, 2, 2, 8, requires_grad=True)
    with pytest.raises(ValueError, match="requires grad"):
        check_borrowed_grad(x)
    with torch.no_grad():
        check_borrowed_grad(x)
    check_borrowed_grad(x.detach())


def test_borrowed_calls_need_an_explicit_tag(world1):
    group = fu.TorchUlyssesGroup(world1)
    with pytest.raises(ValueError, match="tag is None: a borrowed call needs an explicit tag"):
        group.all_to_all_single_4d_borrowed(torch.zeros(1, 2, 2, 8), 0, None)


def test_torch_group_result_requires_grad_only_with_grad(world1):
    group = fu.TorchUlyssesGroup(world1)
    x = torch.ones(1, 2, 2, 8, requires_grad=True)
    assert group.all_to_all_single_4d(x, 0, "t").requires_grad
    with torch.no_grad():
        assert not group.all_to_all_single_4d(x, 0, "t").requires_grad


def test_tag_none_with_a_non_tensor_names_x(world1):
    with pytest.raises(ValueError, match="^x is a list: it must be a torch.Tensor$"):
        fu.TorchUlyssesGroup(world1).all_to_all_single_4d([1, 2], 0)


def test_double_backward_on_the_torch_group(world1):
    """The backward is itself differentiable (it is the group's own entry point)."""
    group = fu.TorchUlyssesGroup(world1)
    x = torch.randn(1, 2, 2, 8, requires_grad=True)
    y = group.all_to_all_single_4d(x, 0, "t")
    (g,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    g.sum().backward()
    assert torch.equal(g, 2 * x) and torch.equal(x.grad, torch.full_like(x, 2.0))


class StandIn:
    """Stands in for a UlyssesGroup built with FAST_ULYSSES_DEBUG=1 on `group_name`: records the
    calls it is asked to check, and refuses them as a disagreement would."""

    def __init__(self, group_name):
        self.group_name = group_name
        self.seen = []

    def _before_call(self, call):
        assert call.x.is_contiguous(), "the check was given the gradient before .contiguous()"
        self.seen.append((call.entry, tuple(call.x.shape), *call[2:]))
        raise ValueError("checked")  # what a disagreement raises, before anything is sent


def test_the_fast_groups_backward_is_checked_through_a_debugged_group(world1):
    """FAST_ULYSSES_DEBUG=1 on UlyssesGroup: the op's C++ backward asks the debugged group
    registered under its group name to check its call first, with the backward's own arguments
    (mode 1 - m on backward_tag(tag), the gradient made contiguous), and its refusal reaches the
    caller of backward() as it was raised. With no debugged group left, nothing is asked."""
    from fast_ulysses import debug

    group = StandIn(world1.group_name)
    debug.register_debugged(group)
    x = torch.zeros(1, 4, 2, 8, device="meta", requires_grad=True)
    try:
        y = torch.ops.fast_ulysses.all_to_all_single_4d(
            x, 0, "q", world1.group_name, [4], None, "bshd", 0
        )
        # The gradient of a sum is expanded (strides 0): the check sees what is sent.
        with pytest.raises(ValueError, match="^checked$"):
            y.sum().backward()
        assert group.seen == [
            ("all_to_all_single_4d (backward)", (1, 4, 2, 8), 1, "q:grad", [4], None, "bshd")
            + (None, None)  # no barrier, no out
        ]
    finally:
        debug.unregister_debugged(group)
    assert debug.debugged(group.group_name) is None
    y = torch.ops.fast_ulysses.all_to_all_single_4d(x, 0, "q", world1.group_name, None, None)
    y.sum().backward()
    assert len(group.seen) == 1 and x.grad.shape == x.shape


def test_fast_op_double_backward_on_meta(world1):
    """The op's backward is itself the op, through its Autograd kernel: differentiable again."""
    x = torch.zeros(1, 6, 4, 8, device="meta", requires_grad=True)
    y = torch.ops.fast_ulysses.all_to_all_single_4d(*op_args(world1, x), rank=0)
    (g,) = torch.autograd.grad((y * y).sum(), x, create_graph=True)
    assert g.requires_grad and g.grad_fn is not None
    g.sum().backward()
    assert x.grad.shape == x.shape


def test_the_borrowed_refusal_is_a_value_error_under_torch_compile(world1):
    """Under torch.compile the borrowed rule runs eagerly (torch.compiler.disable), so the caller
    gets the ValueError itself, not dynamo's error about a failed fake-tensor call."""
    group = fu.TorchUlyssesGroup(world1)
    x = torch.randn(1, 4, 2, 8, requires_grad=True)
    compiled = torch.compile(
        lambda t: group.all_to_all_single_4d_borrowed(t, 0, "q") * 2, backend="aot_eager"
    )
    try:
        with pytest.raises(ValueError, match="all_to_all_single_4d_borrowed: x requires grad"):
            compiled(x)
    finally:
        group.destroy()


def test_aot_autograd_traces_the_cpp_backward_as_the_op(world1):
    """torch.compile's AOTAutograd traces the owned op's C++ backward: the backward graph holds
    the op itself in mode 1 - m on backward_tag(tag) (meta tensors: the Meta kernel serves the
    trace, no GPU)."""
    from torch._functorch.aot_autograd import aot_function

    graphs = []

    def keep(gm, _inputs):
        graphs.append(gm.graph)
        return gm

    def f(x):
        y = torch.ops.fast_ulysses.all_to_all_single_4d(*op_args(world1, x), rank=0)
        return (y * y).sum()

    x = torch.zeros(1, 4, 2, 8, device="meta", requires_grad=True)
    aot_function(f, fw_compiler=keep, bw_compiler=keep)(x).backward()
    assert x.grad.shape == x.shape
    op = torch.ops.fast_ulysses.all_to_all_single_4d.default
    forward, backward = (
        [n.args for n in graph.nodes if n.op == "call_function" and n.target is op]
        for graph in graphs
    )
    assert [(a[1], a[2]) for a in forward] == [(0, "t")], forward
    assert [(a[1], a[2]) for a in backward] == [(1, "t:grad")], backward
