"""The replay store interface: where a resumable stream's events live so a reconnect can pick them up.

A store publishes streams produced in this process (their ``StreamLog``) and opens any stream it knows, local or
(for shared stores) produced by another replica, as a ``ReplaySource`` that a connection reads from its cursor.
Leases let a producer see that some connection, on any replica, still reads the stream.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from eloquent_plugins.transports.config import StreamConfig
    from eloquent_plugins.transports.resume.log import StreamLog


@dataclass(frozen=True, slots=True)
class StreamMeta:
    """What a resume needs besides the events: who owns the stream and the response head to repeat."""

    stream_id: str
    owner: str
    status: int
    headers: tuple[tuple[bytes, bytes], ...]
    route: str = ""
    codec: str = ""
    created: float = 0.0

    def to_json(self) -> str:
        return json.dumps({"stream_id": self.stream_id, "owner": self.owner, "status": self.status,
                           "headers": [[k.decode("latin-1"), v.decode("latin-1")] for k, v in self.headers],
                           "route": self.route, "codec": self.codec, "created": self.created})

    @classmethod
    def from_json(cls, text: str | bytes) -> StreamMeta:
        obj: dict[str, Any] = json.loads(text)
        return cls(obj["stream_id"], obj["owner"], int(obj["status"]),
                   tuple((k.encode("latin-1"), v.encode("latin-1")) for k, v in obj["headers"]),
                   obj.get("route", ""), obj.get("codec", ""), float(obj.get("created", 0.0)))


class ReplaySource(Protocol):
    """One stream as seen by one connection."""

    meta: StreamMeta

    @property
    def end_reason(self) -> str | None:
        """How the stream ended (``complete``, ``error``, ``disconnected``), once known."""

    async def check(self, cursor: int) -> None:
        """Raise ``EventsGone`` if events from ``cursor`` were trimmed, ``ValueError`` if ``cursor`` is in the
        future of a finished stream."""

    def take(self, cursor: int) -> list[bytes]:
        """Frames from ``cursor`` on that are available now (no I/O)."""

    def ended(self, cursor: int) -> bool:
        """True when the stream is over and ``cursor`` is past its last event."""

    async def wait(self, cursor: int, timeout: float, wake: asyncio.Future[None]) -> None:
        """Wait for frames past ``cursor``, at most ``timeout`` s or until ``wake`` resolves (local sources)."""

    def close(self) -> None:
        """Stop listening (the connection is done)."""


class ResumeStore(ABC):
    """Bounded, expiring storage of resumable streams."""

    scheme: str = ""

    @abstractmethod
    async def create(self, token: str, meta: StreamMeta, log: StreamLog, request: bytes | None = None) -> None:
        """Publish a live stream produced in this process; ``request``: its request body, for a store that lets
        another replica continue it (``records_requests``), else ignored."""

    @abstractmethod
    async def finish(self, token: str) -> None:
        """The stream's log is closed: keep it for the TTL, then forget it."""

    @abstractmethod
    async def open(self, token: str) -> ReplaySource | None:
        """A source for ``token``, or None when it is unknown or expired."""

    @abstractmethod
    async def lease(self, token: str, consumer: str, ttl: float) -> None:
        """Say that ``consumer`` reads the stream for the next ``ttl`` seconds."""

    @abstractmethod
    async def release(self, token: str, consumer: str) -> None:
        """``consumer`` stopped reading now (its lease ends now; it still counts as a recent reader)."""

    @abstractmethod
    async def last_watched(self, token: str) -> float | None:
        """The latest lease end (Unix time; in the future while someone reads), or None if none was ever taken.

        A timestamp rather than a yes/no, so that a producer deciding whether a stream is abandoned does not
        depend on *when* it manages to look (a busy event loop may look late)."""

    async def hand_over(self, token: str) -> None:
        """A live stream produced here stops now without an end (this server drains and its deadline came):
        make what it emitted so far readable elsewhere and say at once that its producer is gone, exactly as a
        dead producer's lapsed heartbeat says it (a resume elsewhere ends it, or continues it, without waiting).
        Nothing to do for a store no other process reads."""
        return None

    def held_bytes(self) -> int:
        """Bytes of finished streams this store keeps in this process's memory (live streams are counted by the
        middleware that produces them); part of ``StreamConfig.max_held_bytes``."""
        return 0

    def shed(self, nbytes: int) -> int:
        """Drop finished streams kept in this process, oldest first, until ``nbytes`` are freed (the memory
        budget is reached); returns the bytes freed. A resume of one then gets 404, as after its TTL."""
        return 0

    async def aclose(self) -> None:
        return None


class StoreFactory(Protocol):
    """What ``eloquent_register_resume_stores`` (``resume.hooks``) returns: a URL scheme and a constructor. A
    factory taking several schemes also lists them all in a ``schemes`` tuple."""

    scheme: str

    def create(self, url: str, config: StreamConfig) -> ResumeStore: ...
