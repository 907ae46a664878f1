"""``EloquentClient`` (async; ``AsyncEloquentClient`` is the same class): one API over every way of taking the
same streaming request.

* ``auto`` (default): races, as browsers do. The QUIC handshake starts, and SSE over TCP on the same host starts
  beside it after ``h3_probe_timeout`` (QUIC's head start); a stream begins on whichever answers first and one
  that began on TCP moves to Eloquent datagrams when QUIC comes up (a resume from the next event). TCP refused
  raises ``ConnectError`` at once. The UDP port is ``h3_port``, else the one the origin advertised (``Alt-Svc``),
  else the URL's port number; a path whose handshake never heard back is skipped a while, backing off from 2 s to
  ``udp_retry_after`` (``paths``); one that only lost packets is not.
* ``eloquent``: HTTP/3 datagrams only (``scheme="duplicate"`` asks for the packet-duplication baseline).
* ``h3-stream``: plain SSE on the HTTP/3 reliable request stream (the retransmission baseline).
* ``sse``: plain SSE over HTTP/1.1 with httpx.

A stream the server made resumable (``x-eloquent-stream``) survives a cut -- a dead path (nothing for
``stream_idle_timeout`` seconds), a closed connection, a reset: the client continues it from the first event it
has not rendered, over a new QUIC connection or, under ``auto`` when UDP is gone, over SSE, with the same
headers (the caller binding) and ``Last-Event-ID``. Each event is yielded once, so the text is that of an uncut
stream. Errors are the ``errors`` classes on every path, and ``status``/``headers`` are the server's own.
The HTTP/3 side (the connection, ``auto``'s race) is ``race.H3Paths``; one try is ``attempts``.

    async with EloquentClient("http://127.0.0.1:8000", verify=False) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as s:
            async for event in s.events():
                print(event.text or "", end="")
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json as jsonlib
import time
from collections.abc import AsyncIterator, Collection, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal, Self
from urllib.parse import urlsplit

import httpx

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.protocol import (
    DATAGRAM,
    SCHEME_HEADER,
    STREAM_HEADER,
    TRANSPORT_HEADER,
)

from eloquent_client.attempts import CONNECT_ERRORS, TRANSPORT_ERRORS, Attempt, open_h3, open_sse
from eloquent_client.errors import (
    ClientError,
    ConnectError,
    HTTPStatusError,
    IncompleteStream,
    ResumeRefused,
    StreamBroken,
    TLSVerificationError,
)
from eloquent_client.http3 import Http3ClientConnection
from eloquent_client.pacing import Pacing
from eloquent_client.paths import DEFAULT_UDP_RETRY_AFTER, SHARED, PathMemory
from eloquent_client.race import H3Paths, closed_on_purpose
from eloquent_client.response import Response, ResponseStream, StreamState

Transport = Literal["auto", "eloquent", "h3-stream", "sse"]
TRANSPORTS = ("auto", "eloquent", "h3-stream", "sse")
MAX_MOVES = 4
"""Moves to datagrams one stream may make (``_should_move``)."""
MOVE_AFTER = 0.25
"""Seconds a try on the HTTP/3 request stream runs before it moves to datagrams (the server's view of the
client's SETTINGS catches up within a retransmission)."""
_RESUMABLE = (StreamBroken, IncompleteStream)
"""What ends a try but not the stream: a cut (or a body that ended early) of a resumable stream."""


class EloquentClient:
    def __init__(self, base_url: str, *, transport: Transport = "auto", scheme: str | None = None,
                 verify: bool | str = True, pacing: Pacing | None = None, h3_port: int | None = None,
                 headers: Mapping[str, str] | None = None, timeout: float = 30.0, limits: Limits | None = None,
                 http_client: Any = None, h3_probe_timeout: float = 0.1, stream_idle_timeout: float | None = 3.0,
                 quic_idle_timeout: float = 60.0, resume: bool = True, max_resumes: int = 8,
                 udp_retry_after: float = DEFAULT_UDP_RETRY_AFTER, path_memory: PathMemory | None = None,
                 alt_svc_ports: Collection[int] | None = None) -> None:
        """``verify``: True, False (development only) or a CA/certificate file. ``timeout``: connect (HTTP/3 and
        TCP), response head and resume deadline. ``h3_probe_timeout``: ``auto``'s head start for QUIC, after which
        TCP races it (the handshake goes on). ``stream_idle_timeout``: silence after which an HTTP/3 path is
        dead (None: only QUIC's ``quic_idle_timeout``). ``max_resumes``: cuts one stream may survive.
        ``alt_svc_ports``: UDP ports besides the URL's own that an ``Alt-Svc`` header may send HTTP/3 to (default
        none; never with ``verify=False``: see ``bounds.alt_svc_port``)."""
        if transport not in TRANSPORTS:
            raise ConfigError(f"transport must be one of {', '.join(TRANSPORTS)}, got {transport!r}")
        if scheme is not None and scheme not in ("eloquent", "duplicate", "stream"):
            raise ConfigError(f"scheme must be eloquent, duplicate or stream, got {scheme!r}")
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"base_url must be http(s)://host[:port], got {base_url!r}")
        for name, value in (("timeout", timeout), ("h3_probe_timeout", h3_probe_timeout),
                            ("quic_idle_timeout", quic_idle_timeout)):
            if not value > 0:
                raise ConfigError(f"{name} must be > 0, got {value!r}")
        if stream_idle_timeout is not None and not 0 < stream_idle_timeout < quic_idle_timeout:
            raise ConfigError("stream_idle_timeout must be > 0 and below quic_idle_timeout")
        self.base_url = base_url.rstrip("/")
        self.transport: Transport = transport
        self.scheme = scheme
        self.verify = verify
        self.pacing = pacing
        self.timeout = timeout
        self.h3_probe_timeout = h3_probe_timeout
        self.stream_idle_timeout = stream_idle_timeout
        self.quic_idle_timeout = quic_idle_timeout
        self.resume = resume
        self.max_resumes = max_resumes
        self.udp_retry_after = udp_retry_after
        self.limits = limits or Limits()
        self.headers = dict(headers or {})
        self.memory = path_memory if path_memory is not None else SHARED
        tcp_port = parts.port or (443 if parts.scheme == "https" else 80)
        self._origin = f"{parts.scheme}://{parts.hostname}:{tcp_port}"
        self._prefix = parts.path.rstrip("/")
        self._paths = H3Paths(self, host=parts.hostname, tcp_port=tcp_port, origin=self._origin, h3_port=h3_port,
                              alt_svc_ports=tuple(alt_svc_ports or ()))
        """The HTTP/3 connections and ``auto``'s race."""
        self._http = http_client
        self._own_http = http_client is None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- paths (the HTTP/3 side and its race: ``race.H3Paths``) -------------------------------------------
    @property
    def h3_port(self) -> int:
        """The UDP port HTTP/3 is tried on now."""
        return self._paths.port

    async def connection(self) -> Http3ClientConnection:
        """The HTTP/3 connection, opened on first use (with the whole ``timeout``) and reopened if it closed;
        raises ``ConnectError``."""
        return await self._paths.connection()

    async def h3_if_up(self) -> Http3ClientConnection | None:
        """For a non-streaming request of the httpx transports: as ``H3Paths.up``."""
        return await self._paths.up()

    async def h3_after_tcp_failed(self, exc: BaseException) -> Http3ClientConnection | None:
        """A non-streaming request's TCP connect failed with ``exc``: the HTTP/3 connection if it is up."""
        return self._paths.tcp_refused() if self.transport == "auto" else None

    async def _http_client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(verify=self.verify, timeout=httpx.Timeout(self.timeout, read=None))
        return self._http

    def _learn(self, headers: Mapping[str, str]) -> None:
        self._paths.learn(headers)

    # ---- requests ------------------------------------------------------------------------------------------
    def _body(self, json: Any, content: bytes | None,
              headers: Mapping[str, str] | None) -> tuple[bytes, dict[str, str]]:
        merged = {**self.headers, **(headers or {})}
        if json is not None:
            merged.setdefault("content-type", "application/json")
            return jsonlib.dumps(json).encode(), merged
        return content or b"", merged

    def _h3_headers(self, merged: Mapping[str, str]) -> list[tuple[str, str]]:
        out = [(k, v) for k, v in merged.items() if k.lower() not in ("host", "content-length", "connection")]
        if self.transport in ("auto", "eloquent"):
            out.append((TRANSPORT_HEADER.decode(), DATAGRAM.decode()))
            out.append((SCHEME_HEADER.decode(), self.scheme or "eloquent"))
        if not any(k.lower() == "accept" for k, _ in out):
            out.append(("accept", "text/event-stream"))
        return out

    async def _open_new(self, method: str, path: str, body: bytes, merged: dict[str, str]) -> Attempt | None:
        """A new stream. A server that drains (a rolling restart) refuses it with ``503`` + ``Retry-After`` and
        ``"code": "draining"``, having started nothing; over TCP the balancer sends it to another replica, over
        HTTP/3 it is this client's to do: leave that connection to its streams, and try again on a new one
        (``eloquent``: behind a balancer, perhaps another replica) or once over TCP (``auto``), within the
        timeout."""
        deadline = time.monotonic() + self.timeout
        tcp_only = False
        while True:
            try:
                return await self._open(method, path, body, merged, tcp_only=tcp_only)
            except StreamBroken:
                # Closed cleanly by the server before the head came (it drained, then exited): nothing was
                # started for this request there. Try again on a new connection.
                ours = [c for c in self._paths.connections() if c.closed]
                clean = any(closed_on_purpose(c.close_event) for c in ours)
                if tcp_only or not clean or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
                continue
            except HTTPStatusError as exc:
                conn = self._paths.conn
                if not exc.draining or tcp_only or time.monotonic() > deadline:
                    raise
                if conn is not None:  # it may be closed already (the drain ended): a new one either way
                    await self._paths.retire(conn)
                if self.transport == "auto":
                    tcp_only = True
                else:
                    await asyncio.sleep(min(exc.retry_after, max(0.0, deadline - time.monotonic())))

    async def _open(self, method: str, path: str, body: bytes, merged: dict[str, str], *, offset: int = 0,
                    last_event_id: str | None = None, tcp_only: bool = False) -> Attempt | None:
        """One try (``tcp_only``: SSE over TCP, after a draining server refused it on HTTP/3). Explicit transports
        take their path. ``auto`` races: HTTP/3 when QUIC is up within its head
        start, else SSE over TCP started beside the handshake -- taken if TCP answers first (the stream moves to
        datagrams when QUIC comes up, ``_events``), given up for HTTP/3 if QUIC is up and TCP still has not
        answered after another head start (TCP hangs). TCP refused under ``auto`` raises ``ConnectError`` at once
        unless QUIC is already up: a dead server fails as fast as with plain httpx."""
        resuming = last_event_id is not None
        if resuming:
            merged = {**merged, "last-event-id": last_event_id}  # type: ignore[dict-item]

        async def over_h3(conn: Http3ClientConnection) -> Attempt | None:
            return await open_h3(conn, method, self._prefix + path, self._h3_headers(merged), body,
                                 eloquent=self.transport in ("auto", "eloquent"), offset=offset,
                                 timeout=self.timeout, resuming=resuming)

        conn = None if tcp_only else await self._paths.up()
        if conn is not None:
            try:
                return await over_h3(conn)
            except StreamBroken:
                if self.transport != "auto":
                    raise
                self._paths.udp_failed()  # connected, but the request got no answer: take TCP
        sse = asyncio.ensure_future(open_sse(await self._http_client(), method, self.base_url + path, merged, body,
                                             offset=offset, resuming=resuming))
        task = self._paths.task if self.transport == "auto" and conn is None and not tcp_only else None
        try:
            if task is not None and not task.done():
                await asyncio.wait({sse, task}, return_when=asyncio.FIRST_COMPLETED)
                if not sse.done() and self._paths.raced(task) is not None:
                    await asyncio.wait({sse}, timeout=self.h3_probe_timeout)
                    if not sse.done():  # QUIC is up and TCP still silent: the request goes over HTTP/3
                        sse.cancel()
                        with contextlib.suppress(BaseException):
                            await sse
                        conn = self._paths.up_now()
                        if conn is not None:
                            return await over_h3(conn)
            attempt = await sse
        except ConnectError:
            conn = self._paths.tcp_refused() if self.transport == "auto" and not tcp_only else None
            if conn is None:
                raise
            return await over_h3(conn)
        except BaseException:
            sse.cancel()
            if sse.done() and not sse.cancelled() and sse.exception() is None and sse.result() is not None:
                await sse.result().aclose()  # type: ignore[union-attr]  # TCP answered, the caller gets the error
            raise
        if attempt is not None:
            self._learn(attempt.headers)
        return attempt

    async def _resume(self, method: str, path: str, body: bytes, merged: dict[str, str], token: str,
                      next_index: int, cause: object) -> Attempt | None:
        """Continue stream ``token`` after event ``next_index - 1``; None when the server says it is over."""
        last_id = f"{token}:{next_index - 1}" if next_index > 0 else token
        deadline = time.monotonic() + self.timeout
        failures = 0
        while True:
            try:
                return await self._open(method, path, body, merged, offset=next_index, last_event_id=last_id)
            except ResumeRefused as exc:
                if exc.status != 503 or time.monotonic() > deadline:
                    raise
                error: ClientError = exc
            except TLSVerificationError:
                raise
            except (ConnectError, StreamBroken) as exc:
                error = exc
            failures += 1
            if time.monotonic() > deadline:
                raise StreamBroken(f"stream {token} was cut ({cause}) and could not be resumed within "
                                   f"{self.timeout:g} s: {error}") from error
            await asyncio.sleep(min(0.05 * 2 ** failures, 1.0))

    def _should_move(self, attempt: Attempt, state: StreamState, event: Any) -> bool:
        """A stream that began on TCP moves to datagrams once QUIC is up (``auto``, resumable streams). So does one
        the server put on the HTTP/3 request stream although it asked for datagrams: the request overtook the
        client's SETTINGS (lost, not yet retransmitted), so the server did not know datagrams were welcome; it
        knows a moment later (``MOVE_AFTER``)."""
        if (self.transport != "auto" or not self.resume or state.token is None or state.moves >= MAX_MOVES
                or event.kind != "data" or event.data == "[DONE]" or self._paths.up_now() is None):
            return False
        return attempt.delivery == "sse" or (attempt.delivery == "h3-stream"
                                             and time.monotonic() - state.since >= MOVE_AFTER)

    async def _events(self, state: StreamState, method: str, path: str, body: bytes,
                      merged: dict[str, str]) -> AsyncIterator[Any]:
        while True:
            attempt = state.attempt
            events: Any = attempt.events()  # an async generator: closed here, not left to the GC
            moving = False
            try:
                async for index, event in events:
                    if index < state.next_index:
                        continue  # already rendered (a resume replays from the id it was given)
                    token = state.token
                    if event.index != index or (event.id is None and token is not None):
                        event = dataclasses.replace(event, index=index,
                                                    id=event.id or (f"{token}:{index}" if token else None))
                    state.next_index = index + 1
                    yield event
                    if self._should_move(attempt, state, event):
                        moving = True
                        break
                if not moving:
                    return
                state.moves += 1
                cause: object = "moving over to HTTP/3 datagrams"
            except _RESUMABLE as exc:
                if not self.resume or state.token is None:
                    await attempt.aclose()
                    raise
                if state.resumes >= self.max_resumes:
                    await attempt.aclose()
                    raise StreamBroken(f"stream {state.token} was cut {state.resumes + 1} times; giving up: {exc}") \
                        from exc
                state.resumes += 1
                cause = exc
            finally:
                await events.aclose()
            await attempt.aclose()
            assert state.token is not None
            attempt_or_none = await self._resume(method, path, body, merged, state.token, state.next_index, cause)
            if attempt_or_none is None:
                return
            state.switch(attempt_or_none)

    @asynccontextmanager
    async def stream(self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
                     headers: Mapping[str, str] | None = None) -> AsyncIterator[ResponseStream]:
        """The response head is in when this yields (an error status raises ``HTTPStatusError`` here)."""
        body, merged = self._body(json, content, headers)
        first = await self._open_new(method, path, body, merged)
        assert first is not None
        state = StreamState(first, first.headers.get(STREAM_HEADER))
        source = self._events(state, method, path, body, merged)
        response = ResponseStream(self.transport, first.status, first.headers, source, self.pacing, state=state)
        try:
            yield response
        finally:
            await source.aclose()
            await state.attempt.aclose()

    async def request(self, method: str, path: str, *, json: Any = None, content: bytes | None = None,
                      headers: Mapping[str, str] | None = None) -> Response:
        """A non-streaming request: over HTTP/3 when the transport allows and (``auto``) QUIC is up within its
        head start, else TCP (refused under ``auto``: ``ConnectError`` at once unless QUIC is up)."""
        body, merged = self._body(json, content, headers)
        conn = await self._paths.up()
        if conn is None:
            client = await self._http_client()
            try:
                r = await client.request(method, self.base_url + path, content=body, headers=merged)
            except CONNECT_ERRORS as exc:
                conn = self._paths.tcp_refused() if self.transport == "auto" else None
                if conn is None:
                    raise ConnectError(f"cannot connect to {self._origin}: {exc}") from exc
            except TRANSPORT_ERRORS as exc:
                raise StreamBroken(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
            else:
                self._learn(r.headers)
                return Response(r.status_code, dict(r.headers), r.content, "sse")
        fields = [(k, v) for k, v in merged.items() if k.lower() not in ("host", "content-length", "connection")]
        h3 = await conn.request(method, self._prefix + path, headers=fields, body=body)
        try:
            await h3.wait_headers(self.timeout)
            try:
                content_bytes = await asyncio.wait_for(h3.read(), self.timeout)
            except TimeoutError:
                raise StreamBroken(f"{method} {path}: no complete response within {self.timeout} s") from None
        finally:
            h3.cancel()
        return Response(h3.status or 0, h3.headers, content_bytes, "h3-stream")

    async def aclose(self) -> None:
        await self._paths.aclose()
        if self._http is not None and self._own_http:
            await self._http.aclose()
            self._http = None


AsyncEloquentClient = EloquentClient

__all__ = ["TRANSPORTS", "AsyncEloquentClient", "EloquentClient", "HTTPStatusError", "Response", "ResponseStream",
           "Transport"]
