"""The cross flow of ``bench e2e --trace NAME --cross``: a bulk HTTP/3 download beside the token streams.

The download is an HTTP/3 GET of an endless body from the same front end (``/bulk`` beside the engine), over QUIC
with the front end's congestion control: the kernel's TCP cannot be routed through a user-space UDP relay here
(that would need a TUN device and a network namespace), and a split TCP proxy could not drop its packets, so the
cross flow is congestion-controlled traffic whose losses come from the same queue as the token streams'.

As in the simulator (``sim.links.BulkFlow``: a fresh flow per stream, from ``links.WARMUP`` s before its first
token to 1 s after its last, measured over the stream's tokens), each request gets its own download
(``BulkSchedule``), so both benches put the same kind of flow beside the same trace seconds.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from eloquent_plugins.transports.asgi import ASGIApp, Receive, Scope, Send

BULK_PATH = "/bulk"
BULK_CHUNK = 16 * 1024
BULK_LIMIT = 512 * 1024 * 1024
"""The bulk body's ceiling: far more than any trace here carries in a run; the client cancels it first."""
BULK_TAIL = 1.0
"""Seconds the download runs past the request's last token (the simulator's ``stop``)."""


def bulk_app(inner: ASGIApp) -> ASGIApp:
    """``inner`` with ``GET /bulk`` beside it: an octet stream until the client goes away (or BULK_LIMIT)."""
    chunk = bytes(BULK_CHUNK)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") != BULK_PATH:
            await inner(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream")]})
        sent = 0
        while sent < BULK_LIMIT:  # the front end's send waits while the stream's buffer is full
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            sent += len(chunk)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


@dataclass(slots=True)
class BulkDownload:
    """The cross flow's client: one QUIC connection through the relay, bytes counted as they arrive."""

    arrivals: list[tuple[float, int]] = field(default_factory=list)
    error: str | None = None
    _task: asyncio.Task[None] | None = None
    _conn: Any = None

    async def connect(self, host: str, port: int) -> None:
        from eloquent_client.http3 import Http3ClientConnection

        self._conn = await Http3ClientConnection.connect(host, port, verify=False, idle_timeout=120.0)

    def start(self) -> None:
        """The GET goes out now, on the connection ``connect`` opened (its congestion window still fresh)."""
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        stream = await self._conn.request("GET", BULK_PATH)
        try:
            await stream.wait_headers(30.0)
            items = stream._items  # the raw body's chunks as they come (read() would only give the whole body)
            while True:
                item = await items.get()
                if item is None or isinstance(item, BaseException):
                    if isinstance(item, BaseException):
                        self.error = f"{type(item).__name__}: {item}"
                    return
                if isinstance(item, bytes):
                    self.arrivals.append((time.monotonic(), len(item)))
        finally:
            stream.cancel()

    def throughput(self, start: float, end: float) -> float:
        """Bits per second received in [start, end) (monotonic seconds)."""
        got = sum(n for t, n in self.arrivals if start <= t < end)
        return got * 8 / (end - start) if end > start else 0.0

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._conn is not None:
            await self._conn.close()


async def sleep_until(when: float) -> None:
    await asyncio.sleep(max(0.0, when - time.monotonic()))


@dataclass(slots=True)
class BulkSchedule:
    """One download per request: started at ``begin``, stopped ``BULK_TAIL`` after the request's last token,
    its throughput taken over the request's tokens (first to last generation), as the simulator does. Every
    download's QUIC connection is opened by ``prepare`` at the start, so a handshake never has to get through one
    of the trace's outages (the simulator's flow has none); each starts its GET on a fresh congestion window."""

    address: tuple[str, int]
    flows: list[tuple[BulkDownload, tuple[float, float]]] = field(default_factory=list)
    _ready: list[BulkDownload] = field(default_factory=list)
    _open: BulkDownload | None = None

    async def prepare(self, count: int) -> None:
        self._ready = [BulkDownload() for _ in range(count)]
        await asyncio.gather(*(flow.connect(*self.address) for flow in self._ready))

    async def begin(self, at: float) -> None:
        await sleep_until(at)
        self._open = self._ready.pop(0)
        self._open.start()

    async def end(self, window: tuple[float, float]) -> None:
        """The request's tokens were generated over ``window``; stops the download ``BULK_TAIL`` after it."""
        if self._open is None:
            return
        await sleep_until(window[1] + BULK_TAIL)
        flow, self._open = self._open, None
        await flow.stop()
        self.flows.append((flow, window))

    async def close(self) -> None:
        for flow in [*([self._open] if self._open is not None else []), *self._ready]:
            await flow.stop()
        self._open, self._ready = None, []

    def each_throughput(self) -> list[float]:
        """Per request, its download's bits per second over the request's tokens."""
        return [f.throughput(*w) for f, w in self.flows]

    def throughput(self) -> float | None:
        """Mean over the requests of each download's bits per second over its request's tokens."""
        each = self.each_throughput()
        return sum(each) / len(each) if each else None


async def bulk_alone(run: Any, windows: list[tuple[float, float]], starts: list[float], origin: float) -> float:
    """The cross flow with no token stream over the same trace seconds: ``run`` is an async context manager
    giving a fresh harness; ``windows``/``starts`` are the measured run's, on a relay that started at
    ``origin``. Its throughput over the same windows, shifted to the new relay's start."""
    async with run() as h:
        shift = h.relay.origin - origin
        schedule = BulkSchedule(h.relay.listen_addr)
        try:
            await schedule.prepare(len(starts))
            for start, (w0, w1) in zip(starts, windows):
                await schedule.begin(start + shift)
                await schedule.end((w0 + shift, w1 + shift))
        finally:
            await schedule.close()
        return schedule.throughput() or 0.0
