"""Drain: a replica that is going away (SIGTERM, a rolling restart, ``POST /eloquent/drain``) stops taking new
streams and lets the ones in flight finish, for at most ``drain_timeout`` seconds.

At once: ``/ready`` answers 503 (load balancers and Kubernetes readiness probes stop sending new work; liveness
stays the app's own ``/health``), a new request (a ``POST`` that is not a resume) gets ``503`` + ``Retry-After``
with a JSON body (a balancer retries it on another replica: nothing was started), and the HTTP/3 front end sends
GOAWAY on every connection (``add_listener``). Requests in flight, resumes and ``GET``s go on.

At the deadline every stream still running is *handed over*: its resume store is told the producer is gone now
(``ResumeStore.hand_over``: a resume on another replica sees that at once, as it would see a dead producer's
heartbeat lapse), and its client connection is cut, so that a resuming client (``Last-Event-ID``, HTTP/3 resume)
goes to another replica. Then ``finished`` is set and the server exits.

One ``Drain`` per served app; the SSE middleware serves its routes and tracks the requests, ``eloquent serve``
turns SIGTERM into ``begin`` and exits when ``finished`` is set.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from collections.abc import Awaitable, Callable
from enum import IntEnum
from typing import TYPE_CHECKING

from eloquent_plugins.transports.asgi import Receive, Scope, Send

if TYPE_CHECKING:
    from eloquent_plugins.transports.metrics import StreamMetrics

log = logging.getLogger("eloquent_plugins.transports.drain")

READY_PATH = "/ready"
DRAIN_PATH = "/eloquent/drain"
RETRY_AFTER = 1
"""Seconds a refused client waits before it tries again (another replica takes it)."""
HANDOVER_TIMEOUT = 5.0
"""Seconds one stream's hand-over may take (the store flushing what it holds) before its client is cut anyway."""
_LOOPBACK = ("127.0.0.1", "::1", "localhost")
_FORWARDED = (b"forwarded", b"x-forwarded-for", b"x-real-ip")


class DrainState(IntEnum):
    """Only moves forward."""

    SERVING = 0
    DRAINING = 1
    """Unready; new streams refused; in-flight ones run on until none is left or the deadline."""
    DONE = 2
    """Nothing in flight any more (every stream finished, or was handed over at the deadline)."""


HandOver = Callable[[], Awaitable[None]]


class Drain:
    def __init__(self, timeout: float = 30.0, *, token: str | None = None) -> None:
        self.timeout = timeout
        self.token = token or None
        """With a token, ``POST /eloquent/drain`` needs ``Authorization: Bearer <token>`` from anywhere; without
        one it is taken from loopback only, and never from a request a proxy forwarded."""
        self.state = DrainState.SERVING
        self.reason = ""
        self.in_flight = 0
        """Requests being served (the app's call has not returned): what the drain waits for."""
        self._streams: dict[object, HandOver] = {}
        """Streams and resume connections being served, each with what hands it over at the deadline."""
        self._listeners: list[Callable[[DrainState], None]] = []
        self._idle: asyncio.Event | None = None
        self.finished: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self.metrics: StreamMetrics | None = None
        self.completed = 0
        """Streams that finished during the drain."""
        self.handed_over = 0
        """Streams handed over at the deadline."""
        self.refused = 0

    @property
    def ready(self) -> bool:
        return self.state is DrainState.SERVING

    @property
    def draining(self) -> bool:
        return self.state is not DrainState.SERVING

    def attach(self, metrics: StreamMetrics) -> None:
        """Count in ``metrics`` (the middleware's): drained streams by outcome, refusals, readiness."""
        self.metrics = metrics
        metrics.drain = self

    def add_listener(self, callback: Callable[[DrainState], None]) -> None:
        """``callback(state)`` when the drain begins (DRAINING) and when it is done (DONE)."""
        self._listeners.append(callback)

    def _notify(self) -> None:
        for callback in list(self._listeners):
            try:
                callback(self.state)
            except Exception:  # noqa: BLE001 - one listener's failure must not stop the drain
                log.exception("drain listener failed")

    # ---- what the middleware calls per request ------------------------------------------------------------
    def enter(self) -> None:
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1
        if self.in_flight <= 0 and self._idle is not None:
            self._idle.set()

    def track(self, key: object, hand_over: HandOver) -> None:
        self._streams[key] = hand_over

    def untrack(self, key: object) -> None:
        if self._streams.pop(key, None) is not None and self.state is DrainState.DRAINING:
            self.completed += 1

    # ---- the drain ----------------------------------------------------------------------------------------
    def begin(self, reason: str) -> bool:
        """Start draining (idempotent; False when it had begun already). Needs the running loop."""
        if self.state is not DrainState.SERVING:
            return False
        loop = asyncio.get_running_loop()
        self.state, self.reason = DrainState.DRAINING, reason
        self._idle = asyncio.Event()
        self.finished = self.finished or asyncio.Event()
        if self.in_flight <= 0:
            self._idle.set()
        log.warning("draining (%s): unready, new streams refused with 503; %d request(s) in flight, %d stream(s), "
                    "deadline in %.0f s", reason, self.in_flight, len(self._streams), self.timeout)
        self._notify()
        self._task = loop.create_task(self._run(), name="eloquent-drain")
        return True

    async def wait(self) -> None:
        """Until the drain is done (it may not have begun yet)."""
        if self.finished is None:
            self.finished = asyncio.Event()
        await self.finished.wait()

    async def _run(self) -> None:
        assert self._idle is not None and self.finished is not None
        started = time.monotonic()
        try:
            await asyncio.wait_for(self._idle.wait(), self.timeout)
        except asyncio.TimeoutError:
            await self._hand_over_all()
        log.warning("drain done after %.1f s: %d stream(s) finished, %d handed over, %d new request(s) refused",
                    time.monotonic() - started, self.completed, self.handed_over, self.refused)
        self.state = DrainState.DONE
        self._notify()
        self.finished.set()

    async def _hand_over_all(self) -> None:
        streams, self._streams = self._streams, {}
        if not streams:
            return
        log.warning("drain deadline (%.0f s): handing over %d stream(s) still running", self.timeout, len(streams))
        results = await asyncio.gather(*(asyncio.wait_for(h(), HANDOVER_TIMEOUT) for h in streams.values()),
                                       return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                log.warning("handing a stream over failed: %r", result)
        self.handed_over += len(streams)

    # ---- routes -------------------------------------------------------------------------------------------
    async def serve_route(self, scope: Scope, receive: Receive, send: Send) -> bool:
        """``/ready`` and ``/eloquent/drain``; False when ``scope`` is neither (the request goes on)."""
        path = scope.get("path")
        if path == READY_PATH and scope.get("method") in ("GET", "HEAD"):
            status = 200 if self.ready else 503
            await _json(send, status, {"ready": self.ready, "draining": self.draining, "in_flight": self.in_flight},
                        head=scope.get("method") == "HEAD")
            return True
        if path == DRAIN_PATH:
            if scope.get("method") != "POST":
                await _json(send, 405, _error("POST starts the drain", "method_not_allowed"), [(b"allow", b"POST")])
            elif not self._allowed(scope):
                await _json(send, 403, _error("draining needs the drain token (ELOQUENT_DRAIN_TOKEN) or a request "
                                              "from loopback that no proxy forwarded", "forbidden"))
            else:
                self.begin("POST /eloquent/drain")
                await _json(send, 202, {"draining": True, "drain_timeout": self.timeout,
                                        "in_flight": self.in_flight})
            return True
        return False

    def _allowed(self, scope: Scope) -> bool:
        headers = scope.get("headers") or ()
        if self.token is not None:
            given = next((v for k, v in headers if k == b"authorization"), b"")
            return hmac.compare_digest(given, b"Bearer " + self.token.encode())
        client = scope.get("client") or ("", 0)
        return client[0] in _LOOPBACK and not any(k in _FORWARDED for k, _ in headers)

    def refuses(self, scope: Scope) -> bool:
        """A new request while draining: a ``POST`` (the caller tells resumes apart first)."""
        return self.state is not DrainState.SERVING and scope.get("method") == "POST"

    async def refuse(self, send: Send, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        """The 503 for a new request while draining (``body``/``headers``: the route's JSON error)."""
        self.refused += 1
        await send({"type": "http.response.start", "status": 503,
                    "headers": [*headers, (b"retry-after", str(RETRY_AFTER).encode())]})
        await send({"type": "http.response.body", "body": body})


def _error(message: str, code: str) -> dict[str, object]:
    return {"error": {"message": message, "type": code, "code": code}}


async def _json(send: Send, status: int, obj: object, extra: list[tuple[bytes, bytes]] | None = None, *,
                head: bool = False) -> None:
    body = json.dumps(obj).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store"), *(extra or [])]})
    await send({"type": "http.response.body", "body": b"" if head else body})
