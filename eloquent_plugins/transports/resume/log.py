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

    __slots__ = ("frames", "base", "next_index", "dropped", "appended", "closed", "reason", "_max_events",
                 "_max_bytes", "listeners", "index_cap", "byte_cap")

    def __init__(self, *, max_events: int = 100_000, max_bytes: int = 8 << 20) -> None:
        self.frames: list[bytes] = []
        self.base = 0
        """Index of ``frames[0]``."""
        self.next_index = 0
        """The index the next frame gets: ``base + len(frames)``, kept as a field because readers check it per
        event."""
        self.dropped = 0
        """Bytes of every frame dropped so far (trimmed or discarded): ``nbytes`` is ``appended - dropped``."""
        self.appended = 0
        """Bytes of every frame ever appended (the byte offset of ``next_index``)."""
        self.closed = False
        self.reason: str | None = None
        self._max_events = max_events
        self._max_bytes = max_bytes
        self.index_cap = max_events
        """``base + max_events``: an append that takes ``next_index`` past it trims (one comparison per event)."""
        self.byte_cap = max_bytes
        """``dropped + max_bytes``: an append that takes ``appended`` past it trims."""
        self.listeners: list[Callable[[], None]] = []
        """Wake callbacks, called on every append and at the close (``listen``). Public because the direct write
        (``sse.event_path.EventPath.write``) appends inline when its own source is the only one."""

    @property
    def nbytes(self) -> int:
        """Bytes of the frames held now."""
        return self.appended - self.dropped

    @property
    def max_events(self) -> int:
        return self._max_events

    @max_events.setter
    def max_events(self, value: int) -> None:
        self._max_events = value
        self._recap()

    @property
    def max_bytes(self) -> int:
        return self._max_bytes

    @max_bytes.setter
    def max_bytes(self, value: int) -> None:
        self._max_bytes = value
        self._recap()

    def _recap(self) -> None:
        """The caps after ``base``, ``dropped`` or a bound changed."""
        self.index_cap = self.base + self._max_events
        self.byte_cap = self.dropped + self._max_bytes

    def start_at(self, index: int) -> None:
        """An empty log whose first event is ``index`` (a migrated stream continues at the reader's cursor)."""
        if self.frames:
            raise ValueError("start_at is for an empty log")
        self.base = self.next_index = index
        self._recap()

    def append(self, frame: bytes) -> None:
        self.frames.append(frame)
        end = self.next_index = self.next_index + 1
        appended = self.appended = self.appended + len(frame)
        if end > self.index_cap or appended > self.byte_cap:
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
        self.dropped += freed
        self._recap()
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
        target_events = self._max_events - self._max_events // 8
        target_bytes = self._max_bytes - self._max_bytes // 8
        drop = 0
        nbytes = self.nbytes
        while drop < len(frames) - 1 and (len(frames) - drop > target_events or nbytes > target_bytes):
            nbytes -= len(frames[drop])
            drop += 1
        del frames[:drop]
        self.base += drop
        self.dropped = self.appended - nbytes
        self._recap()
