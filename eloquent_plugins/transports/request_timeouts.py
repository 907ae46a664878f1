"""Request-side timeouts for HTTP/1.1: slowloris clients that trickle a request's headers or body are cut.

Two pieces, because the two halves of a request are read in different places:

* ``header_timeout_protocol(seconds)``: a uvicorn h11 protocol class (``uvicorn.Config(http=...)``). uvicorn has
  no header-read timeout, so a client that sends one byte of its request line every few seconds holds a
  connection forever. Here a connection must deliver a complete request line and headers within ``seconds`` of
  opening, or of the first byte it sends after a response (the idle gap between two requests is uvicorn's own
  ``timeout_keep_alive`` rule, which this one does not shorten). Late: ``408`` with a JSON body and
  ``Connection: close`` when nothing of that exchange was sent yet, then the connection is closed.
* ``BodyTimeoutMiddleware``: an ASGI middleware. While the request body is incomplete, an app whose next chunk
  does not come within ``timeout`` seconds of the last, or comes under ``min_rate`` (``transports/body_budget.py``,
  ``BodyClock``), gets ``http.disconnect`` (so it stops, and the engine never starts a request for a body it has
  not got); the client gets ``408`` (JSON, ``Connection: close``) if the response had not started. What the body
  holds meanwhile counts in the server's ledger (``HeldBodies``): past a ceiling, ``413``/``429``/``503`` the same
  way. Anything the app sends afterwards is dropped.

The HTTP/3 front end applies the same rules itself as bytes arrive (``http3/request.py``, ``http3/guards.py``);
QUIC handshakes and idle connections are bounded by the QUIC idle timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable
from enum import Enum
from functools import lru_cache
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from eloquent_plugins.core.codecs import BUILTIN_CODECS
from eloquent_plugins.core.codecs.router import CodecRouter
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.asgi import ASGIApp, Message, Receive, Scope, Send
from eloquent_plugins.transports.body_budget import BodyClock, BodyRefusal, HeldBodies, HeldBody
from eloquent_plugins.transports.sse.headers import json_error
from eloquent_plugins.transports.sse.socket_control import SOCKET_EXTENSION, WRITE_HIGH_WATER, socket_extension

log = logging.getLogger("eloquent_plugins.http")

_DISCONNECT: dict[str, Any] = {"type": "http.disconnect"}
_ROUTER = CodecRouter({codec.name: codec for codec in BUILTIN_CODECS})
"""The built-in codecs on the default routes: these timeouts sit outside any middleware's own routing."""


def request_timeout_body(message: str, path: str = "") -> bytes:
    """The ``408`` body, in the error shape of the route at ``path`` (``""``, no request line yet: OpenAI's)."""
    return json_error(_ROUTER, path, 408, message, 408, type_="request_timeout")[2]


def _timeout_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"cache-control", b"no-store"), (b"connection", b"close")]


# -- headers (uvicorn h11) --------------------------------------------------------------------------------------


class HeaderTimeoutH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on reading each request's line and headers.

    Use ``header_timeout_protocol(seconds)`` for a class with another deadline; this one has 30 s.
    """

    header_timeout: float = 30.0
    send_buffer: int = 0
    """``SO_SNDBUF`` of each connection (0: the kernel's autotuning); see ``StreamConfig.socket_send_buffer``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._socket: dict[str, Any] = {}
        self._app = self.app
        self.app = self._app_with_socket

    async def _app_with_socket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Each request's app call, with the ``eloquent.socket`` extension: the middleware can abort a connection
        it cut instead of leaving its unsent bytes to a close that never drains (``sse/socket_control.py``)."""
        scope.setdefault("extensions", {})[SOCKET_EXTENSION] = self._socket
        await self._app(scope, receive, send)

    # The timer runs while the connection holds no request the app is working on and bytes are due: from the
    # connection opening, and from the first byte after a response (a new request, or the rest of a body the
    # app answered early). It stops as soon as h11 has parsed a request's headers.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._socket = socket_extension(transport)
        transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)  # a non-reader's unsent bytes wait in the log
        if self.send_buffer:
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.send_buffer)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._header_timer is None and not self._serving():
            self._arm_header_timer()
        super().data_received(data)
        if self._serving() or self.transport.is_closing():
            self._cancel_header_timer()
        elif (self._header_timer is not None and self.conn.our_state is h11.IDLE
              and self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]):
            # These bytes only finished a body whose response already went out (an early 413): no request is
            # due, the connection is idle again. Back to uvicorn's keep-alive rule (super() stopped its timer),
            # not a 408 nobody asked for.
            self._cancel_header_timer()
            if self.timeout_keep_alive_task is None:
                self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                    self.timeout_keep_alive_handler)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may parse a pipelined request already buffered
        if self.transport.is_closing() or self._serving():
            self._cancel_header_timer()
        elif self._header_timer is None and self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
            self._arm_header_timer()  # part of the next request is already here: its headers are due now
        # otherwise the connection is idle: uvicorn's keep-alive timer (armed by super()) decides

    def handle_websocket_upgrade(self, event: h11.Request) -> None:
        self._cancel_header_timer()  # the websocket protocol takes the transport over
        super().handle_websocket_upgrade(event)

    def _serving(self) -> bool:
        """A request's headers are in and its response is not complete: the app owns the connection now."""
        cycle = self.cycle
        return cycle is not None and not cycle.response_complete and self.conn.their_state is not h11.IDLE

    def _arm_header_timer(self) -> None:
        timeout = self.header_timeout
        if timeout > 0 and self.transport is not None and not self.transport.is_closing():
            self._cancel_header_timer()
            self._header_timer = self.loop.call_later(timeout, self._header_timed_out)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timed_out(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self._serving():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "client"
        if self.conn.our_state is h11.IDLE and self.conn.their_state is h11.IDLE:
            log.info("%s sent no complete request headers within %.1fs: 408, connection closed", client,
                     self.header_timeout)
            body = request_timeout_body(f"request headers not received within {self.header_timeout:g} s")
            head = [b"HTTP/1.1 408 Request Timeout\r\n"]
            for name, value in [*self.server_state.default_headers, *_timeout_headers(body)]:
                head += [name, b": ", value, b"\r\n"]
            head.append(b"\r\n")
            self.transport.write(b"".join(head) + body)
        else:  # the rest of a body whose response already went out: nothing more to say
            log.info("%s still sending a request body %.1fs after its response: connection closed", client,
                     self.header_timeout)
        self.transport.close()


@lru_cache(maxsize=32)
def header_timeout_protocol(seconds: float, send_buffer: int = 0) -> type[HeaderTimeoutH11Protocol]:
    """The protocol class for ``uvicorn.Config(http=...)`` with a ``seconds`` header deadline (0: none) and a
    ``send_buffer``-byte kernel send buffer per connection (0: the kernel's autotuning)."""
    if not seconds >= 0:
        raise ConfigError(f"header timeout must be >= 0, got {seconds}")
    if not send_buffer >= 0:
        raise ConfigError(f"socket send buffer must be >= 0, got {send_buffer}")
    return type("HeaderTimeoutH11Protocol", (HeaderTimeoutH11Protocol,),
                {"header_timeout": float(seconds), "send_buffer": int(send_buffer)})


# -- bodies (ASGI) ----------------------------------------------------------------------------------------------


class BodyTimeoutMiddleware:
    """A request body that stalls for ``timeout`` seconds (0: off) or arrives under ``min_rate`` bytes/s once
    ``grace`` is over (0: off) gets ``408``; one whose held bytes pass a ceiling of ``bodies`` (the server's ledger
    of incomplete requests, ``transports/body_budget.py``) gets ``413``/``429``/``503``. Each a JSON body with
    ``Connection: close`` when the response has not started, and the app sees ``http.disconnect``. HTTP/3
    requests pass untouched: the front end applies the same rules as their bytes arrive."""

    def __init__(self, app: ASGIApp, timeout: float = 30.0, *, min_rate: float = 0.0, grace: float = 0.0,
                 bodies: HeldBodies | None = None) -> None:
        for name, value in (("body timeout", timeout), ("body min rate", min_rate), ("body rate grace", grace)):
            if not value >= 0:
                raise ConfigError(f"{name} must be >= 0, got {value}")
        self.app = app
        self.timeout = timeout
        self.min_rate = min_rate
        self.grace = grace
        self.bodies = bodies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope.get("http_version") == "3"
                or not (self.timeout or self.min_rate or self.bodies is not None)):
            await self.app(scope, receive, send)
            return
        exchange = _BodyDeadline(self, scope, receive, send)
        try:
            await self.app(scope, exchange.receive, exchange.send)
        finally:
            exchange.release()  # an app that returned (or failed) before the body was in holds none of it


class _Body(Enum):
    """Where the request body of one exchange is."""

    ARRIVING = "arriving"
    """Incomplete: it must keep its pace, and what it holds counts in the ledger."""
    COMPLETE = "complete"
    """All in (or not a body message): only the disconnect is left to wait for, with no deadline."""
    REFUSED = "refused"
    """Too late, too slow or over a ceiling: the app is told the client left, and what it sends is dropped."""

_COMPLETE = _Body.COMPLETE  # ``send`` runs per event: a global read, not an Enum attribute lookup


class _BodyDeadline:
    __slots__ = ("_receive", "_send", "body", "bodies", "clock", "held", "scope", "started")

    def __init__(self, mw: BodyTimeoutMiddleware, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        self._receive = receive
        self._send = send
        self.body = _Body.ARRIVING
        self.bodies = mw.bodies
        self.clock = BodyClock(mw.timeout, mw.min_rate, mw.grace, asyncio.get_running_loop().time())
        self.held: HeldBody | None = None
        """What the body holds in the ledger, from its first chunk that leaves it incomplete."""
        self.started = False
        """The response has started (the app's, or our refusal)."""

    async def receive(self) -> Message:
        if self.body is _Body.REFUSED:
            return dict(_DISCONNECT)
        if self.body is _Body.COMPLETE:
            return await self._receive()  # only the disconnect is left to wait for: no deadline
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(self.clock.deadline()):
                message = await self._receive()
        except TimeoutError:
            late = self.clock.refusal(loop.time())
            if self.bodies is not None:
                self.bodies.count(late.reason)
            return await self._refuse(late)
        if message["type"] == "http.request" and message.get("more_body", False):
            size = len(message.get("body", b""))
            self.clock.arrived(size, loop.time())
            refusal = self._hold(size)
            if refusal is not None:
                return await self._refuse(refusal)
        elif self.body is _Body.ARRIVING:
            self.body = _Body.COMPLETE
            self.release()
        return message

    def _hold(self, size: int) -> BodyRefusal | None:
        if self.bodies is None:
            return None
        if self.held is not None:
            return self.held.hold(size)
        client = self.scope.get("client")
        self.held = self.bodies.open(tuple(client) if client else self, str(client[0]) if client else None)
        declared = next((v for k, v in self.scope.get("headers", ()) if k == b"content-length"), b"")
        expected = int(declared) - size if declared.isdigit() and len(declared) <= 18 else 0
        return self.held.hold(size, expected=max(0, expected))  # a body that cannot fit is refused at its start

    def release(self) -> None:
        if self.held is not None:
            self.held.release()

    def send(self, message: Message) -> Awaitable[None]:
        # Runs once per streamed event: once the body is in, no deadline is left to enforce, so hand the server's
        # own send coroutine back (no coroutine of ours per event; 0.19 -> 0.06 us/event, issue 16 item 4).
        if self.body is _COMPLETE:
            return self._send(message)
        return self._send_arriving(message)

    async def _send_arriving(self, message: Message) -> None:
        if self.body is _Body.REFUSED:
            return  # our refusal answered (or the client was cut): the app's own response goes nowhere
        if message["type"] == "http.response.start":
            self.started = True
        await self._send(message)

    async def _refuse(self, refusal: BodyRefusal) -> Message:
        self.body = _Body.REFUSED
        self.release()
        client = self.scope.get("client")
        who = f"{client[0]}:{client[1]}" if client else "client"
        log.info("%s %s %s: %s: %s", who, self.scope.get("method"), self.scope.get("path"), refusal.message,
                 "cut" if self.started else refusal.status)
        if not self.started:
            self.started = True
            body = json_error(_ROUTER, self.scope.get("path", ""), refusal.status, refusal.message, refusal.code,
                              type_=refusal.error_type)[2]
            headers = _timeout_headers(body)
            if refusal.retry_after is not None:
                headers.append((b"retry-after", str(refusal.retry_after).encode()))
            await self._send({"type": "http.response.start", "status": refusal.status, "headers": headers})
            await self._send({"type": "http.response.body", "body": body, "more_body": False})
        return dict(_DISCONNECT)
