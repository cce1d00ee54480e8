"""The package's environment switches, parsed by one rule: unset or empty gives the default,
"0" or "1" sets it, anything else is a ValueError naming the variable (a typo never silently
turns a switch off). The C++ side (watchdog, copy batching, host profile) reads its own
variables by the same rule.
"""

from __future__ import annotations

import os

DEBUG_ENV = "FAST_ULYSSES_DEBUG"
SHARED_GPU_ENV = "FAST_ULYSSES_ALLOW_SHARED_GPU"

_MEANINGS = {
    DEBUG_ENV: "0 (off) or 1 (check every call's agreement across ranks)",
    SHARED_GPU_ENV: "0 (off) or 1 (accept ranks sharing one GPU: a test set-up)",
}


def switch(name: str, default: bool) -> bool:
    """The 0|1 switch `name` (one of this module's names), `default` when unset or empty.

    Raises:
        ValueError naming the variable, its value and the accepted values.
    """
    value = os.environ.get(name, "")
    if value == "":
        return default
    if value not in ("0", "1"):
        raise ValueError(f"{name}={value}: must be {_MEANINGS[name]}")
    return value == "1"


def check_switches() -> None:
    """Parses every switch of this module, so that a tool can refuse a bad value up front.

    Raises:
        ValueError for the first switch with a value other than unset, empty, 0 or 1.
    """
    for name in _MEANINGS:
        switch(name, False)
