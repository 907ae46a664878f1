"""A ``ReplaySource`` over an in-process ``StreamLog`` (the producing replica, or the memory store)."""

from __future__ import annotations

import asyncio

from eloquent_plugins.transports.resume.log import EventsGone, StreamLog
from eloquent_plugins.transports.resume.base import StreamMeta


class LocalSource:
    __slots__ = ("meta", "log", "_wake", "held")

    def __init__(self, meta: StreamMeta, log: StreamLog) -> None:
        self.meta = meta
        self.log = log
        self._wake: asyncio.Future[None] | None = None
        self.held = False
        """While set, appends do not wake the reader (the producer is writing them to it directly)."""
        log.listen(self._on_change)

    def _on_change(self) -> None:
        if self.held:
            return
        fut = self._wake
        if fut is not None:
            self._wake = None
            if not fut.done():
                fut.set_result(None)

    async def check(self, cursor: int) -> None:
        if cursor < self.log.base:
            raise EventsGone(f"events before {self.log.base} are no longer kept")
        if cursor > self.log.next_index:
            raise ValueError(f"event {cursor - 1} was never sent on this stream")

    def take(self, cursor: int) -> list[bytes]:
        return self.log.take(cursor)

    def ended(self, cursor: int) -> bool:
        return self.log.closed and cursor >= self.log.next_index

    @property
    def end_reason(self) -> str | None:
        return self.log.reason

    async def wait(self, cursor: int, timeout: float, wake: asyncio.Future[None]) -> None:
        if cursor < self.log.next_index or self.log.closed:
            return
        self._wake = wake
        await wake

    def close(self) -> None:
        self.log.unlisten(self._on_change)
        self._wake = None
