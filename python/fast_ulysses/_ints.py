"""The int rule of the plan's Python entry points (`plan`, `simulate`, `input_shape`): an integer
(an int or anything with __index__, never a bool) that fits int64, the type the plan's ops take.

Checked here so that a float, a bool or 2**63 is refused by name as a FastUlyssesError, instead
of by the op's schema ("Expected a value of type 'int'") or by a silent narrowing.
"""

from __future__ import annotations

import operator

import torch

from .errors import FastUlyssesError

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
INT64_RANGE = "it must fit in int64 (-2^63 to 2^63 - 1)"


def _example(value) -> str:
    """ " (e.g. 2)" for a float or str that spells an int64 integer (2.0, "2"), else ""."""
    if isinstance(value, float) and value.is_integer() or isinstance(value, str):
        try:
            number = int(value)
        except (ValueError, OverflowError):
            return ""
        if INT64_MIN <= number <= INT64_MAX:
            return f" (e.g. {number})"
    return ""


def as_int(value, name: str) -> int:
    """`value` as an int64-sized int.

    Raises:
        FastUlyssesError("<name> is <value>: <rule>") for a bool (or a bool tensor), anything
        without __index__ (a float is never cut short, a str is not parsed) and an integer
        outside int64.
    """
    if type(value) is not int:
        if isinstance(value, bool) or getattr(value, "dtype", None) == torch.bool:
            raise FastUlyssesError(f"{name} is {value!r}: it must be an int, not a bool")
        try:
            value = operator.index(value)
        except TypeError:
            raise FastUlyssesError(
                f"{name} is {value!r}: it must be an int{_example(value)}"
            ) from None
    if not INT64_MIN <= value <= INT64_MAX:
        raise FastUlyssesError(f"{name} is {value}: {INT64_RANGE}")
    return value


def as_ints(values, name: str) -> list[int]:
    """A sequence of integers (a shape) as a list of int64-sized ints.

    Raises:
        FastUlyssesError naming `name` for a `values` that is not a sequence (a str is not
        one), or `name[i]` for an entry `as_int` refuses.
    """
    if type(values) is torch.Size:  # (a tensor's shape, the per-call case: int64 entries)
        return list(values)
    try:
        if isinstance(values, (str, bytes)):
            raise TypeError
        out = list(values)
    except TypeError:
        raise FastUlyssesError(
            f"{name} is {values!r}: it must be a sequence of ints (e.g. (1, 9450, 40, 128))"
        ) from None
    for i, v in enumerate(out):
        if type(v) is not int or not INT64_MIN <= v <= INT64_MAX:
            out[i] = as_int(v, f"{name}[{i}]")
    return out
