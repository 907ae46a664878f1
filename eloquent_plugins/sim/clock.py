"""A virtual clock and event queue: the whole simulation is one deterministic sequence of callbacks."""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from eloquent_plugins.core.errors import EloquentError


class SimulationError(EloquentError):
    """The simulated run did not finish (a scheme never delivered every token within the time guard)."""


class EventLoop:
    __slots__ = ("now", "_queue", "_seq")

    def __init__(self) -> None:
        self.now = 0.0
        self._queue: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._seq = 0  # FIFO among equal times keeps runs reproducible

    def at(self, when: float, callback: Callable[..., None], *args: Any) -> None:
        heapq.heappush(self._queue, (max(when, self.now), self._seq, callback, args))
        self._seq += 1

    def run_until(self, when: float) -> None:
        """Run what is due up to ``when`` and stop there; the rest stays scheduled."""
        queue = self._queue
        while queue and queue[0][0] <= when:
            at, _, callback, args = heapq.heappop(queue)
            self.now = at
            callback(*args)
        self.now = max(self.now, when)

    def run(self, limit: float) -> None:
        """Run until nothing is scheduled; raise if virtual time would pass ``limit``."""
        queue = self._queue
        while queue:
            when, _, callback, args = heapq.heappop(queue)
            if when > limit:
                raise SimulationError(f"simulation still busy at {limit:.0f} s of virtual time")
            self.now = when
            callback(*args)
