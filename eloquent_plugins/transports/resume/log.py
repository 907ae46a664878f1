"""The in-process log of one stream: framed events by index, read by any number of connections.

The producer appends; connections (and the Redis mirror) register a wake callback and read from their own
cursor, so a slow reader never slows the producer and everything queued for it goes out in one write.
``appended`` counts every byte ever appended, so a reader that tracks the byte offset it has written knows how
much is queued for it (``StreamConfig.max_queued_bytes``) without summing frames.
"""

from __future__ import annotations

from collections.abc import Callable

from eloquent_plugins.core.errors import EloquentError


class EventsGone(EloquentError):
    """The requested events were trimmed from the log (bounded per stream, or shed under the memory budget)."""


class StreamLog:
    """Append-only frames with a moving base index; bounded by event count and bytes (oldest dropped first)."""

    __slots__ = ("frames", "base", "next_index", "nbytes", "appended", "closed", "reason", "max_events", "max_bytes",
                 "listeners")

    def __init__(self, *, max_events: int = 100_000, max_bytes: int = 8 << 20) -> None:
        self.frames: list[bytes] = []
        self.base = 0
        """Index of ``frames[0]``."""
        self.next_index = 0
        """The index the next frame gets: ``base + len(frames)``, kept as a field because readers check it per
        event."""
        self.nbytes = 0
        """Bytes of the frames held now."""
        self.appended = 0
        """Bytes of every frame ever appended (the byte offset of ``next_index``)."""
        self.closed = False
        self.reason: str | None = None
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.listeners: list[Callable[[], None]] = []
        """Wake callbacks, called on every append and at the close (``listen``). Public because the direct write
        (``Connection.write_direct``) appends inline when its own source is the only one."""

    def append(self, frame: bytes) -> None:
        self.frames.append(frame)
        self.next_index += 1
        size = len(frame)
        self.nbytes += size
        self.appended += size
        if self.next_index - self.base > self.max_events or self.nbytes > self.max_bytes:
            self.trim()
        for wake in self.listeners:
            wake()

    def close(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.reason = reason
        for wake in self.listeners:
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

    def offset(self, cursor: int) -> int:
        """The byte offset of event ``cursor`` (held, or ``next_index``): what a reader starting there has had."""
        start = max(0, min(cursor - self.base, len(self.frames)))
        return self.appended - sum(map(len, self.frames[start:]))

    def discard_before(self, index: int) -> int:
        """Drop the frames before ``index`` (every reader has written them); returns the bytes freed. A resume from
        before them then gets ``EventsGone`` (a 410), never a silent gap."""
        drop = min(index - self.base, len(self.frames))
        if drop <= 0:
            return 0
        freed = sum(map(len, self.frames[:drop]))
        del self.frames[:drop]
        self.base += drop
        self.nbytes -= freed
        return freed

    def listen(self, wake: Callable[[], None]) -> None:
        self.listeners.append(wake)

    def unlisten(self, wake: Callable[[], None]) -> None:
        try:
            self.listeners.remove(wake)
        except ValueError:
            pass

    def trim(self) -> None:
        """Back under ``max_events`` and ``max_bytes`` (``append`` calls it when either is passed)."""
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
