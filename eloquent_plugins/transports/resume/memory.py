"""The embedded default store: streams in this process's memory, bounded per stream and in total, with a TTL.

URL: ``memory://`` with optional query ``max_streams``, ``max_stream_events``, ``max_stream_bytes``,
``max_total_bytes``. Each middleware owns its store (no module-level state).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, urlsplit

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.resume.base import ReplaySource, ResumeStore, StreamMeta
from eloquent_plugins.transports.resume.local import LocalSource


@dataclass(frozen=True, slots=True)
class MemoryLimits:
    max_streams: int = 10_000
    max_stream_events: int = 100_000
    max_stream_bytes: int = 8 << 20
    max_total_bytes: int = 256 << 20

    @classmethod
    def from_url(cls, url: str) -> MemoryLimits:
        values: dict[str, int] = {}
        for key, value in parse_qsl(urlsplit(url).query):
            if key not in cls.__dataclass_fields__:
                raise ConfigError(f"unknown memory store option {key!r} in {url!r}")
            if not (value.isascii() and value.isdigit()) or int(value) < 1:  # isdigit alone takes "²"
                raise ConfigError(f"memory store option {key} must be a positive integer, got {value!r}")
            values[key] = int(value)
        return cls(**values)


@dataclass(slots=True)
class _Entry:
    meta: StreamMeta
    log: StreamLog
    expires: float | None = None
    leases: dict[str, float] = field(default_factory=dict)


class MemoryStore(ResumeStore):
    scheme = "memory"

    def __init__(self, ttl: float = 300.0, limits: MemoryLimits | None = None, clock=time.monotonic) -> None:
        self.ttl = ttl
        self.limits = limits or MemoryLimits()
        self._clock = clock
        self._streams: OrderedDict[str, _Entry] = OrderedDict()
        """Live streams in creation order, then finished ones in the order they finished (oldest first)."""
        self._next_sweep = 0.0
        self._finished_bytes = 0
        self.evicted = 0
        """Finished streams dropped before their TTL (over ``max_streams`` / ``max_total_bytes``, or ``shed``)."""

    def new_log(self) -> StreamLog:
        return StreamLog(max_events=self.limits.max_stream_events, max_bytes=self.limits.max_stream_bytes)

    async def create(self, token: str, meta: StreamMeta, log: StreamLog, request: bytes | None = None) -> None:
        self._evict()
        self._streams[token] = _Entry(meta, log)

    async def finish(self, token: str) -> None:
        entry = self._streams.get(token)
        if entry is not None:
            if entry.expires is None:
                self._finished_bytes += entry.log.nbytes
            entry.expires = self._clock() + self.ttl
            entry.leases.clear()
            self._streams.move_to_end(token)

    async def open(self, token: str) -> ReplaySource | None:
        self._evict()
        entry = self._streams.get(token)
        return None if entry is None else LocalSource(entry.meta, entry.log)

    async def lease(self, token: str, consumer: str, ttl: float) -> None:
        entry = self._streams.get(token)
        if entry is not None:
            entry.leases[consumer] = time.time() + ttl

    async def release(self, token: str, consumer: str) -> None:
        entry = self._streams.get(token)
        if entry is not None and consumer in entry.leases:
            entry.leases[consumer] = min(entry.leases[consumer], time.time())

    async def last_watched(self, token: str) -> float | None:
        entry = self._streams.get(token)
        if entry is None or not entry.leases:
            return None
        return max(entry.leases.values())

    def __len__(self) -> int:
        return len(self._streams)

    def held_bytes(self) -> int:
        return self._finished_bytes

    def shed(self, nbytes: int) -> int:
        freed = 0
        for token in [t for t, e in self._streams.items() if e.expires is not None]:
            if freed >= nbytes:
                break
            freed += self._drop(token)
            self.evicted += 1
        return freed

    def _drop(self, token: str) -> int:
        """Forget a stream; the bytes of a finished one leave the accounting."""
        entry = self._streams.pop(token)
        if entry.expires is None:
            return 0
        self._finished_bytes -= entry.log.nbytes
        return entry.log.nbytes

    def _evict(self) -> None:
        """Drop expired streams, then the oldest finished ones while over the stream-count or byte budget.

        A full sweep is O(streams), so it runs at most every 0.2 s unless the stream count is at its limit."""
        now = self._clock()
        streams = self._streams
        if now < self._next_sweep and len(streams) < self.limits.max_streams:
            return
        self._next_sweep = now + 0.2
        for token in [t for t, e in streams.items() if e.expires is not None and e.expires <= now]:
            self._drop(token)
        total = sum(e.log.nbytes for e in streams.values())
        if len(streams) < self.limits.max_streams and total <= self.limits.max_total_bytes:
            return
        for token in [t for t, e in streams.items() if e.expires is not None]:
            if len(streams) < self.limits.max_streams and total <= self.limits.max_total_bytes:
                break
            total -= streams[token].log.nbytes
            self._drop(token)
            self.evicted += 1


class MemoryStoreFactory:
    scheme = "memory"

    def create(self, url: str, config: StreamConfig) -> MemoryStore:
        return MemoryStore(ttl=config.resume_ttl, limits=MemoryLimits.from_url(url))
