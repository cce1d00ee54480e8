"""The argparse types of the commands' integer options. A value that is not an integer, lies
outside int64 (what the ops take) or outside the option's range is argparse's one-line usage
error naming the option (exit 2), never a traceback."""

from __future__ import annotations

import argparse
import re

from .._ints import INT64_MAX, INT64_MIN

_INTEGER = re.compile(r"\s*[+-]?[0-9][0-9_]*\s*")  # what int() reads, past its digit limit too


def _shown(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _int64(text: str) -> tuple[int, str]:
    """(int(text), "") when `text` is an int64-sized integer, else (0, why not)."""
    try:
        value = int(text)
    except ValueError:
        if not _INTEGER.fullmatch(text):
            return 0, "is not an integer"
        value = INT64_MAX + 1  # more digits than int() reads: beyond int64 either way
    if not INT64_MIN <= value <= INT64_MAX:
        return 0, "is beyond int64: it must be in [-2^63, 2^63 - 1]"
    return value, ""


def integer(example: int | str, minimum: int | None = None, maximum: int | None = None):
    """An argparse `type`: an int64-sized int in [minimum, maximum] (either end may be open).
    `example` is named in every refusal. With both ends set, any integer outside them, one past
    int64 too, is refused by naming that range."""

    def parse(text: str) -> int:
        value, why = _int64(text)
        bounded = minimum is not None and maximum is not None
        if why and not (bounded and _INTEGER.fullmatch(text)):
            raise argparse.ArgumentTypeError(f"{_shown(text)} {why} (e.g. {example})")
        # An integer past int64 with both ends set is out of that range: the message names the
        # option's own range ([1, 8]), not int64's.
        if (
            why
            or (minimum is not None and value < minimum)
            or (maximum is not None and value > maximum)
        ):
            rule = (
                f">= {minimum}"
                if maximum is None
                else f"<= {maximum}"
                if minimum is None
                else f"in [{minimum}, {maximum}]"
            )
            raise argparse.ArgumentTypeError(
                f"{_shown(text)} is out of range: it must be {rule} (e.g. {example})"
            )
        return value

    parse.__name__ = "integer"  # (argparse's fallback message names the type)
    return parse


def integers_like(example: str):
    """An argparse `type`: `integers` whose refusals give `example` (a value of that option:
    a shape for --shape, splits for --seq-splits)."""

    def parse(text: str) -> list[int]:
        return integers(text, example)

    parse.__name__ = "integers"  # (argparse's fallback message names the type)
    return parse


def integers(text: str, example: str = "1,9450,40,128") -> list[int]:
    """An argparse `type`: comma-separated int64-sized ints (--shape, --seq-splits,
    --head-splits); an empty item (1,,1 or a trailing comma) is refused, not skipped, and so
    is a value with no integer at all. `example` (default: a shape) is given in a refusal."""
    hint = f"(give comma-separated integers, e.g. {example})"
    if not text.strip():  # an empty --seq-splits "" would otherwise read as "not given"
        raise argparse.ArgumentTypeError(f"{_shown(text)} holds no integer {hint}")
    values = []
    for i, v in enumerate(text.split(",")):
        if not v.strip():
            raise argparse.ArgumentTypeError(f"{_shown(text)}: item {i + 1} is empty {hint}")
        value, why = _int64(v)
        if why:
            raise argparse.ArgumentTypeError(f"{_shown(text)}: {_shown(v.strip())} {why} {hint}")
        values.append(value)
    return values
