"""Optional token pacing (off by default): release events at a reading pace, as Andes' token pacer does, so
the burst that follows a stall reads smoothly instead of jumping.

Sans-I/O: ``release_at(arrival)`` says when an event arriving at ``arrival`` should be shown. Events are never
shown before they arrive; they are spaced at least ``interval`` apart; and none is held more than ``max_lag``
behind its arrival, so pacing can smooth a burst but never turns a fast stream into a slow one for long.
"""

from __future__ import annotations

from dataclasses import dataclass

from eloquent_plugins.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Pacing:
    interval: float = 0.04
    """Minimum seconds between two released events (about 25 tokens/s, faster than anyone reads)."""
    max_lag: float = 0.5
    """Longest an event may be held back behind its arrival."""

    def __post_init__(self) -> None:
        if self.interval < 0 or self.max_lag < 0:
            raise ConfigError("pacing interval and max_lag must be >= 0")


class Pacer:
    __slots__ = ("_last", "pacing")

    def __init__(self, pacing: Pacing) -> None:
        self.pacing = pacing
        self._last: float | None = None

    def release_at(self, arrival: float) -> float:
        at = arrival if self._last is None else max(arrival, self._last + self.pacing.interval)
        at = min(at, arrival + self.pacing.max_lag)
        self._last = at
        return at
