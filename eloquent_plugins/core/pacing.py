"""Pacing sends to a fixed tick against timing side channels (``--send-tick``; docs/SECURITY.md), sans-I/O.

Padding hides how large each token is, not when it came: one send per token gives an observer the engine's
rhythm, which can depend on the content. With a tick, work that falls due between two multiples of it waits for
the next one, so every send happens at a multiple of the tick on the sender's clock (whatever clock the caller
passes: the event loop's for the transports, simulated time for the simulator and the tests). Stdlib only.
"""

from __future__ import annotations

import math

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.core.errors import ConfigError

MAX_TICK = 1.0
"""Largest tick (seconds): every send may wait this long, as ``StreamConfig.send_tick`` allows."""
_SLACK = 1e-9
"""A time this many ticks past a multiple counts as on it: ``k * tick`` computed twice may differ in the last bit,
and a send already on the grid must not wait a whole tick more for it."""


def check_tick(tick: float) -> None:
    """Raise ``ConfigError`` unless ``tick`` is a finite number of seconds in ``[0, MAX_TICK]`` (0: no pacing)."""
    require_finite("send_tick", tick)
    if tick > MAX_TICK:
        raise ConfigError(f"send_tick must be between 0 and {MAX_TICK:g} second, got {tick!r}")


def next_tick(t: float, tick: float) -> float:
    """The first multiple of ``tick`` at or after ``t`` (``tick`` > 0); never below ``t``: a timer set for it must
    find its deadline passed (``t`` itself when it is on the multiple but for rounding)."""
    return max(math.ceil(t / tick - _SLACK) * tick, t)


def on_tick(t: float, tick: float) -> bool:
    """Whether ``t`` is a multiple of ``tick`` (within the rounding ``next_tick`` allows): what a test checks."""
    k = round(t / tick)
    return abs(t - k * tick) <= 1e-6 * tick
