"""The in-process log of one stream: framed events by index, read by any number of connections.

The producer appends; connections (and the Redis mirror) register a wake callback and read from their own
cursor, so a slow reader never slows the producer and everything queued for it goes out in one write.
"""

from __future__ import annotations

from collections.abc import Callable


class EventsGone(Exception):
    """The requested events were trimmed from the log (bounded per stream)."""


class StreamLog:
    """Append-only frames with a moving base index; bounded by event count and bytes (oldest dropped first)."""

    __slots__ = ("frames", "base", "nbytes", "closed", "reason", "max_events", "max_bytes", "_listeners")

    def __init__(self, *, max_events: int = 100_000, max_bytes: int = 8 << 20) -> None:
        self.frames: list[bytes] = []
        self.base = 0
        """Index of ``frames[0]``."""
        self.nbytes = 0
        self.closed = False
        self.reason: str | None = None
        self.max_events = max_events
        self.max_bytes = max_bytes
        self._listeners: list[Callable[[], None]] = []

    @property
    def next_index(self) -> int:
        return self.base + len(self.frames)

    def append(self, frame: bytes) -> None:
        frames = self.frames
        frames.append(frame)
        self.nbytes += len(frame)
        if len(frames) > self.max_events or self.nbytes > self.max_bytes:
            self._trim()
        for wake in self._listeners:
            wake()

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.reason = reason
        for wake in self._listeners:
            wake()

    def take(self, cursor: int) -> list[bytes]:
        """Frames with index >= ``cursor`` (empty when caught up); raises EventsGone if some were trimmed."""
        start = cursor - self.base
        if start < 0:
            raise EventsGone(f"events before {self.base} are no longer kept")
        frames = self.frames
        if start >= len(frames):
            return []
        return frames[start:] if start else frames[:]

    def listen(self, wake: Callable[[], None]) -> None:
        self._listeners.append(wake)

    def unlisten(self, wake: Callable[[], None]) -> None:
        try:
            self._listeners.remove(wake)
        except ValueError:
            pass

    def _trim(self) -> None:
        # Drop about an eighth at a time so trimming is amortised O(1) per append.
        frames = self.frames
        target_events = self.max_events - self.max_events // 8
        target_bytes = self.max_bytes - self.max_bytes // 8
        drop = 0
        nbytes = self.nbytes
        while drop < len(frames) - 1 and (len(frames) - drop > target_events or nbytes > target_bytes):
            nbytes -= len(frames[drop])
            drop += 1
        del frames[:drop]
        self.base += drop
        self.nbytes = nbytes
