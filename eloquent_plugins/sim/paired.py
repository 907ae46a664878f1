"""How sure a ratio of two means is when both were measured on the same streams: a paired bootstrap.

A real link's stall is heavy-tailed: most streams 0, a few of them 0.5-1 (one outage each). Thirty streams resolve a
row's mean to about one such stream, so "end to end within 1.2x of the simulator" asks more than thirty samples can
tell; the interval says what they can. Paired: both benches ran each stream on the same stretch of trace, so the
streams are resampled together and what both share (the trace's outages) does not widen the interval.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from eloquent_plugins.core.errors import InvalidArgument


def ratio_of(top: float, bottom: float) -> float:
    """top / bottom, where 0 / 0 is 1 (neither stalls) and x / 0 is infinite."""
    return top / bottom if bottom > 0 else (1.0 if top == 0 else float("inf"))


def paired_ratio_interval(numerator: Sequence[float], denominator: Sequence[float], *, level: float = 0.95,
                          draws: int = 10000, seed: int = 1) -> tuple[float, float]:
    """The ``level`` percentile interval of mean(numerator) / mean(denominator) over ``draws`` resamplings of the
    streams (the i-th of each list is the same stream), seeded: the same lists give the same interval. A draw whose
    denominator mean is 0 counts as an infinite ratio (or 1 when the numerator's is 0 too)."""
    if len(numerator) != len(denominator):
        raise InvalidArgument(f"{len(numerator)} values against {len(denominator)}: the streams must pair up")
    if not numerator:
        raise InvalidArgument("no streams to compare")
    if not 0 < level < 1:
        raise InvalidArgument(f"level must be between 0 and 1, got {level}")
    if draws < 1:
        raise InvalidArgument(f"draws must be at least 1, got {draws}")
    rng = random.Random(seed)
    n = len(numerator)
    ratios: list[float] = []
    for _ in range(draws):
        picks = [rng.randrange(n) for _ in range(n)]
        top = sum(numerator[i] for i in picks)
        bottom = sum(denominator[i] for i in picks)
        ratios.append(ratio_of(top, bottom))
    ratios.sort()
    tail = (1 - level) / 2
    return ratios[int(tail * (draws - 1))], ratios[int((1 - tail) * (draws - 1))]
