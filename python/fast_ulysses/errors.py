"""`FastUlyssesError`: the one exception class of a call fast-ulysses refuses.

It subclasses both ValueError (what a bad argument is in Python) and RuntimeError (what code
written for the op's earlier API, which raised through torch's dispatcher, catches), so either
`except` clause keeps working. Errors raised in C++ (the plan's and the transport's, which reach
Python as ValueError) are turned into it at the public entry points (`refused`, `public`).
"""

from __future__ import annotations

import functools


class FastUlyssesError(ValueError, RuntimeError):
    """A call fast-ulysses refused: the message names the argument, its value and the rule."""


def refused(error: BaseException) -> FastUlyssesError:
    """`error` as a FastUlyssesError (itself when it already is one), keeping its message and
    traceback. Use: `except ValueError as error: raise refused(error) from None`."""
    if isinstance(error, FastUlyssesError):
        return error
    return FastUlyssesError(str(error)).with_traceback(error.__traceback__)


def public(function):
    """Decorates a public function or method that is not on a collective's per-call path: any
    ValueError it raises (from C++ too) reaches the caller as a FastUlyssesError."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        try:
            return function(*args, **kwargs)
        except ValueError as error:
            raise refused(error) from None

    return wrapper
