"""Time-varying conditions: outages (everything dropped) and loss-rate changes, in seconds from the start."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Outage:
    start: float
    duration: float

    def covers(self, t: float) -> bool:
        return self.start <= t < self.start + self.duration


@dataclass(frozen=True, slots=True)
class LossSchedule:
    """Piecewise-constant loss rate: ``points[i] = (time, loss)`` holds from its time to the next."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        times = [t for t, _ in self.points]
        if not self.points or times != sorted(set(times)):
            raise ConfigError("a loss schedule needs at least one point and strictly increasing times")
        for _, loss in self.points:
            if not 0.0 <= loss < 1.0:
                raise ConfigError(f"loss rate must be in [0, 1), got {loss}")

    def at(self, t: float, default: float) -> float:
        """The scheduled loss at ``t``; ``default`` before the first point."""
        i = bisect.bisect_right([p[0] for p in self.points], t) - 1
        return default if i < 0 else self.points[i][1]


def _float(text: str, what: str, spec: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{what} must be a number in {spec!r}, got {text!r}") from None
    return require_finite(f"{what} in {spec!r}", value)


def parse_outage(spec: str) -> Outage:
    """``START:DURATION`` in seconds, e.g. ``5:2`` drops everything from 5 s to 7 s."""
    parts = spec.split(":")
    if len(parts) != 2:
        raise ConfigError(f"outage must be START:DURATION in seconds, got {spec!r}")
    start, duration = (_float(p.strip(), what, spec) for p, what in zip(parts, ("start", "duration")))
    if duration <= 0:
        raise ConfigError(f"outage duration must be > 0, got {spec!r}")
    return Outage(start, duration)


def parse_loss_schedule(spec: str) -> LossSchedule:
    """``T:LOSS,T:LOSS,...`` in seconds and fractions, e.g. ``0:0.3,10:0.0``."""
    points: list[tuple[float, float]] = []
    for item in spec.split(","):
        parts = item.strip().split(":")
        if len(parts) != 2:
            raise ConfigError(f"loss schedule items must be TIME:LOSS, got {item.strip()!r} in {spec!r}")
        points.append((_float(parts[0], "time", spec), _float(parts[1], "loss", spec)))
    if [t for t, _ in points] != sorted({t for t, _ in points}):
        raise ConfigError(f"loss schedule times must strictly increase: {spec!r}")
    return LossSchedule(tuple(points))
