"""The package's environment switches. They are parsed in one place, csrc/env/env.cpp, which
the transport reads too: unset or empty gives the default, "0" or "1" sets a switch, and anything
else is a ValueError naming the variable (a typo never silently turns a switch off).
"""

from __future__ import annotations

from ._ops import _C

DEBUG_ENV = "FAST_ULYSSES_DEBUG"
CHECK_CALLS_ENV = "FAST_ULYSSES_CHECK_CALLS"
SHARED_GPU_ENV = "FAST_ULYSSES_ALLOW_SHARED_GPU"


def switch(name: str) -> bool:
    """The 0|1 switch `name` (DEBUG_ENV, CHECK_CALLS_ENV, SHARED_GPU_ENV, or one the transport
    reads), its default when unset or empty.

    Raises:
        ValueError naming the variable, its value and the accepted values.
    """
    return _C.env_switch(name)


def check_switches() -> None:
    """Parses every FAST_ULYSSES_* setting (the switches above, the transport's own switches and
    the watchdog's WATCHDOG_S and WATCHDOG_ACTION: csrc/env/env.cpp lists them all), so that a
    tool can refuse a bad value up front.

    Raises:
        ValueError for the first setting with a value it cannot take.
    """
    _C.check_env()


def settings_error() -> str:
    """`check_switches`'s refusal as text, "" when every setting parses: what a rank reports
    in its `RankInfo`, so that every rank of a group raises for one rank's bad value instead of
    that rank alone (which would leave the others waiting in the group's rendezvous)."""
    try:
        check_switches()
    except ValueError as error:
        return str(error)
    return ""
