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


def test_the_fast_groups_backward_is_checked_through_a_debugged_group():
    """FAST_ULYSSES_DEBUG=1 on UlyssesGroup: the backward (which calls the C++ op directly) asks
    the debugged group registered under its process-group name to check its call first, with
    the backward's arguments: mode 1 - m on backward_tag(tag)."""
    from fast_ulysses import autograd, debug

    seen = []

    class Group:  # stands in for a UlyssesGroup built with FAST_ULYSSES_DEBUG=1
        group_name = "debugged-test-group"

        def _before_call(self, name, x, mode, tag, seq_splits, head_splits, layout):
            assert x.is_contiguous(), "the check was given the gradient before .contiguous()"
            seen.append((name, tuple(x.shape), mode, tag, seq_splits, head_splits, layout))
            raise ValueError("checked")  # what a disagreement raises, before anything is sent

    group = Group()
    debug.register_debugged(group)
    try:

        class Ctx:
            pass

        # What torch.library hands the setup: every argument, in schema order.
        ctx = Ctx()
        autograd._setup_owned(
            ctx, (torch.zeros(1, 4, 2, 8), 0, "q", group.group_name, [2, 2], None, "bshd", 0), None
        )
        # The gradient of a sum is expanded (strides 0): the check sees what is sent, the
        # contiguous gradient.
        with pytest.raises(ValueError, match="checked"):
            autograd._backward_owned(ctx, torch.zeros(1).expand(1, 4, 2, 8))
        assert seen == [
            ("all_to_all_single_4d (backward)", (1, 4, 2, 8), 1, "q:grad", [2, 2], None, "bshd")
        ]
    finally:
        debug.unregister_debugged(group)
    assert debug.debugged(group.group_name) is None


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
