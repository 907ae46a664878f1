"""argparse types for every number a command line takes: each refuses what its option cannot mean.

Why at parse time: argparse then answers ``eloquent <command>: error: argument --x: expected ...`` with exit 2,
naming the option. Checked later, a bad number surfaced as a traceback from deep inside (``--tpot nan``), or was
taken silently (``--keepalive nan`` turned keep-alive off: NaN passes a ``< 0`` test). ``tests/cli/test_cli_numbers.py``
walks every numeric option of every command and fails on one that is not typed with these.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import TypeVar

_N = TypeVar("_N", int, float)


def number(parse: Callable[[str], _N], what: str, *, low: float = 0, low_open: bool = False,
           high: float = math.inf, high_open: bool = True) -> Callable[[str], _N]:
    """A type that parses with ``parse`` and keeps values between ``low`` and ``high`` (each end open or closed
    as told); NaN and infinity never pass. ``what`` names the expected value in error messages."""
    bottom, top = "(" if low_open else "[", ")" if high_open else "]"
    if high == math.inf:
        bounds = f"{'>' if low_open else '>='} {low:g}"
    else:
        bounds = f"in {bottom}{low:g}, {high:g}{top}"

    def convert(text: str) -> _N:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        above = low < value if low_open else low <= value
        inside = above and (value < high if high_open else value <= high)
        if not (inside and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"expected {what} {bounds}, got {text!r}")
        return value

    convert.__name__ = what  # what argparse calls the type in its own messages
    convert.number_type = True  # type: ignore[attr-defined]  # the marker tests/cli/test_cli_numbers.py looks for
    return convert


seconds = number(float, "seconds")
"""A duration: finite, >= 0 (where an option documents it, 0 turns the feature off)."""
positive_seconds = number(float, "seconds", low_open=True)
"""A timeout that must be able to pass: finite, > 0."""
milliseconds = number(float, "milliseconds")
positive_milliseconds = number(float, "milliseconds", low_open=True)
"""A delay that cannot be 0: finite, > 0."""
count = number(int, "a whole number")
"""A whole number >= 0 (0 meaning none or unlimited where the option says so)."""
positive = number(int, "a whole number", low=1)
seed = number(int, "a whole-number seed")
port = number(int, "a port number", high=65535, high_open=False)
"""0-65535; 0 asks the system for a free port."""
loss_rate = number(float, "a loss rate", high=1.0)
kbps = number(float, "kbit/s", low_open=True)
burst = number(float, "a mean burst length in packets", low=1.0)
fraction = number(float, "a fraction", high=1.0)
growth = number(float, "a ratio between size classes", low=1.1, high=16.0, high_open=False)
"""The ratio between padding size classes: in [1.1, 16], as ``core.padding.PaddingPolicy`` requires."""
