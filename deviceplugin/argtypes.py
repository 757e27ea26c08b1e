"""argparse ``type=`` validators shared by the command lines (``icl dra``, ``icl kubelet-emu``, ``icl dra measure``).

Each turns bad text into :class:`argparse.ArgumentTypeError`, so argparse prints one line naming the option and
the value and exits 2 (no traceback). Here, below every command, because the product parts may not import the
simulator or the entry point (pyproject.toml's import-linter contracts), and both of those may import this.

>>> positive_int()("3"), positive_seconds("0.5")
(3, 0.5)
>>> positive_int("a whole number of devices")("0")
Traceback (most recent call last):
...
argparse.ArgumentTypeError: want a whole number of devices >= 1, got '0'
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

__all__ = ["positive_int", "positive_seconds"]


def positive_int(what: str = "a whole number") -> Callable[[str], int]:
    """A validator of a whole number >= 1; ``what`` names it in the error (``want <what> >= 1, got '0'``)."""

    def convert(text: str) -> int:
        try:
            n = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"want {what} >= 1, got {text!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"want {what} >= 1, got {text!r}")
        return n

    return convert


def positive_seconds(text: str) -> float:
    """A finite number of seconds > 0."""
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"want seconds > 0, got {text!r}") from None
    if not (s > 0 and math.isfinite(s)):
        raise argparse.ArgumentTypeError(f"want seconds > 0, got {text!r}")
    return s
