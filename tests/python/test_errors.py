"""fast_ulysses.FastUlyssesError: one class for every refused call, caught by `except ValueError`
and by `except RuntimeError` (what code written for the op's earlier API catches)."""

from __future__ import annotations

import pytest

import fast_ulysses as fu
from fast_ulysses.errors import FastUlyssesError, public, refused


def test_it_is_a_value_error_and_a_runtime_error():
    assert issubclass(FastUlyssesError, ValueError)
    assert issubclass(FastUlyssesError, RuntimeError)
    assert fu.FastUlyssesError is FastUlyssesError


def test_refused_keeps_the_message_and_is_idempotent():
    error = refused(ValueError("x is 3: rule"))
    assert type(error) is FastUlyssesError and str(error) == "x is 3: rule"
    assert refused(error) is error


def test_public_turns_a_plain_value_error_into_ours_and_passes_others():
    @public
    def bad():
        raise ValueError("name is value: rule")

    @public
    def other():
        raise KeyError("untouched")

    with pytest.raises(FastUlyssesError, match="name is value: rule"):
        bad()
    with pytest.raises(KeyError):
        other()


def test_refusals_from_cpp_reach_the_caller_as_ours():
    """The plan's refusals are raised in C++ (a plain ValueError there): plan() hands them on as
    FastUlyssesError, so `except RuntimeError` code catches them too."""
    with pytest.raises(RuntimeError, match="layout"):
        fu.plan(2, 0, 0, (1, 4, 4, 8), "bf16", layout="bsdh")
    with pytest.raises(FastUlyssesError, match="head_splits"):
        fu.plan(2, 0, 0, (1, 4, 5, 8), "bf16")


def test_group_arguments_beyond_int64_are_refused_by_name():
    """The groups' entry points convert splits and mode with arguments.as_splits / as_mode: an
    int beyond int64 is refused by name, never passed on to the op's schema (a RuntimeError)."""
    from fast_ulysses.arguments import as_mode, as_splits

    with pytest.raises(FastUlyssesError, match=r"head_splits\[1\] is 9223372036854775808"):
        as_splits([1, 2**63], "head_splits")
    with pytest.raises(FastUlyssesError, match="mode is"):
        as_mode(2**64)
    assert as_splits([0, 2**63 - 1], "seq_splits") == [0, 2**63 - 1]
