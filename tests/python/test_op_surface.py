"""The op surface: torch.ops.fast_ulysses holds the collectives, the fused op, the group's
lifecycle, the plan and the FP8 wire's passes (and check_norm_rope, which traced code calls);
every other rule and constant Python asks about is a function or attribute of
`fast_ulysses._C`. The collectives' argument names, which autograd unpacks by, are the schemas'
own (one X-macro makes both)."""

from __future__ import annotations

import pytest
import torch

import fast_ulysses  # noqa: F401  (registers the ops)
from fast_ulysses._ops import _C

OPS = {
    # the collectives and the fused op
    "all_to_all_single_4d",
    "all_to_all_single_4d_out",
    "all_to_all_single_4d_borrowed",
    "qk_norm_rope_all_to_all",
    # the group's lifecycle and state
    "create_group",
    "reserve",
    "barrier",
    "destroy_group",
    "forget_group",
    "group_stats",
    "check_device",
    "host_profile",
    # the plan
    "plan",
    "host_copy",
    # the fused op's rules, traced inside the fallback's unfused math (test_fused.py)
    "check_norm_rope",
    # the FP8 wire's passes (fast_ulysses.wire), traced inside compiled wire calls
    "wire_quantize",
    "wire_dequantize",
    "wire_dequantize_out",
}

FUNCTIONS = {
    "env_switch",
    "check_env",
    "check_group",
    "check_tag_use",
    "window_for_call",
    "shapes",
    "check_input",
    "check_borrowed_grad",
    "set_backward_check",  # FAST_ULYSSES_DEBUG's hook in the owned op's C++ backward
}
CONSTANTS = {
    "LIMITS",
    "LAYOUTS",
    "DESCRIPTOR_FIELDS",
    "GROUP_STATS_KEYS",
    "NORMS",
    "ROPE_STYLES",
    "OWNED_ARGUMENTS",
    "BORROWED_ARGUMENTS",
    "FUSED_ARGUMENTS",
    "BACKWARD_SUFFIX",
}


def test_the_ops_are_those_that_move_data_hold_state_plan_or_are_traced():
    registered = {
        name.split("::", 1)[1]
        for name in torch._C._dispatch_get_all_op_names()
        if name.startswith("fast_ulysses::")
    }
    assert registered == OPS, (sorted(registered - OPS), sorted(OPS - registered))


def test_the_rules_and_constants_are_the_modules():
    public = {name for name in dir(_C) if not name.startswith("_")}
    assert public == FUNCTIONS | CONSTANTS, sorted(public ^ (FUNCTIONS | CONSTANTS))


@pytest.mark.parametrize(
    "op,names",
    [
        ("all_to_all_single_4d", "OWNED_ARGUMENTS"),
        ("all_to_all_single_4d_out", "OWNED_ARGUMENTS"),
        ("all_to_all_single_4d_borrowed", "BORROWED_ARGUMENTS"),
        ("qk_norm_rope_all_to_all", "FUSED_ARGUMENTS"),
    ],
)
def test_argument_names_are_the_schemas(op, names):
    """The names autograd unpacks a call by are the schema's arguments, in order (the out= op
    adds its keyword-only `out`)."""
    schema = getattr(torch.ops.fast_ulysses, op).default._schema
    positional = [a.name for a in schema.arguments if not a.kwarg_only]
    assert tuple(positional) == getattr(_C, names)


def test_constants_are_the_plans_definitions():
    assert _C.LIMITS["max_world_size"] == 8 and _C.LIMITS["max_tags"] == 256
    assert _C.LAYOUTS == ("bshd", "sbhd", "bhsd")
    assert _C.GROUP_STATS_KEYS[:3] == ("pool_bytes", "used_bytes", "segments")


@pytest.mark.parametrize(
    "call,message",
    [
        (
            lambda: _C.check_group("2", 0),
            r"check_group\(\): world_size must be an int64 int, not str",
        ),
        (lambda: _C.check_group(2**64, 0), r"world_size must be an int64 int"),
        (lambda: _C.check_group(2), r"check_group\(\) takes 2 arguments \(1 given\)"),
        (lambda: _C.check_tag_use("t", 0, 1, False), r"known must be a bool, not int"),
        (lambda: _C.shapes(2, 0, 0, 1, 8, [1, 1.0], [1, 1], "bshd"), r"seq_splits must be a list"),
        (lambda: _C.check_input([1]), r"check_input\(\): x must be a torch.Tensor, not list"),
        (lambda: _C.env_switch(3), r"env_switch\(\): name must be a str, not int"),
    ],
)
def test_functions_refuse_a_wrong_type_by_name(call, message):
    with pytest.raises(TypeError, match=message):
        call()


def test_functions_raise_the_rules_value_error():
    with pytest.raises(ValueError, match=r"world_size=9: must be in \[1, 8\]"):
        _C.check_group(9, 0)
    with pytest.raises(ValueError, match=r"x has shape \[1, 1, 1\]: it must be 4-d"):
        _C.check_input(torch.zeros(1, 1, 1))
    assert _C.check_input(torch.zeros(1, 1, 1, 1, dtype=torch.bfloat16)) == 2
    assert _C.shapes(2, 0, 0, 1, 64, [4, 4], [4, 4], "bshd") == ([1, 4, 8, 64], [1, 8, 4, 64])
    assert _C.window_for_call("t", 10, -1, False) == 10
