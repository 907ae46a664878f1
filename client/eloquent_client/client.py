"""``EloquentClient`` (async; ``AsyncEloquentClient`` is the same class): one API over every way of taking the
same streaming request.

* ``auto`` (default): HTTP/3 with Eloquent datagrams when UDP answers within ``h3_probe_timeout``, else SSE over
  TCP on the same host. The UDP port is ``h3_port``, else the one the origin advertised (``Alt-Svc``), else the
  URL's port number; a UDP path that failed is skipped for ``udp_retry_after`` seconds (``paths``).
* ``eloquent``: HTTP/3 datagrams only (``scheme="duplicate"`` asks for the packet-duplication baseline).
* ``h3-stream``: plain SSE on the HTTP/3 reliable request stream (the retransmission baseline).
* ``sse``: plain SSE over HTTP/1.1 with httpx.

A stream the server made resumable (``x-eloquent-stream``) survives a cut -- a dead path (nothing for
``stream_idle_timeout`` seconds), a closed connection, a reset: the client continues it from the first event it
has not rendered, over a new QUIC connection or, under ``auto`` when UDP is gone, over SSE, with the same
headers (the caller binding) and ``Last-Event-ID``. Each event is yielded once, so the text is that of an uncut
stream. Errors are the ``errors`` classes on every path, and ``status``/``headers`` are the server's own.

    async with EloquentClient("http://127.0.0.1:8000", verify=False) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as s:
            async for event in s.events():
                print(event.text or "", end="")
"""

from __future__ import annotations

import asyncio
import dataclasses
import json as jsonlib
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any, Literal, Self
from urllib.parse import urlsplit

import httpx

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.protocol import (
    ALT_SVC_HEADER,
    DATAGRAM,
    H3_NO_ERROR,
    SCHEME_HEADER,
    STREAM_HEADER,
    TRANSPORT_HEADER,
)

from eloquent_client.attempts import Attempt, open_h3, open_sse
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
from eloquent_client.response import Response, ResponseStream, StreamState

Transport = Literal["auto", "eloquent", "h3-stream", "sse"]
TRANSPORTS = ("auto", "eloquent", "h3-stream", "sse")
_RESUMABLE = (StreamBroken, IncompleteStream)
"""What ends a try but not the stream: a cut (or a body that ended early) of a resumable stream."""


class EloquentClient:
    def __init__(self, base_url: str, *, transport: Transport = "auto", scheme: str | None = None,
                 verify: bool | str = True, pacing: Pacing | None = None, h3_port: int | None = None,
                 headers: Mapping[str, str] | None = None, timeout: float = 30.0, limits: Limits | None = None,
                 http_client: Any = None, h3_probe_timeout: float = 1.0, stream_idle_timeout: float | None = 3.0,
                 quic_idle_timeout: float = 60.0, resume: bool = True, max_resumes: int = 8,
                 udp_retry_after: float = DEFAULT_UDP_RETRY_AFTER, path_memory: PathMemory | None = None) -> None:
        """``verify``: True, False (development only) or a CA/certificate file. ``timeout``: connect (explicit
        HTTP/3 transports), response head and resume deadline. ``h3_probe_timeout``: how long ``auto`` waits for
        the QUIC handshake before it takes TCP. ``stream_idle_timeout``: silence after which an HTTP/3 path is
        dead (None: only QUIC's ``quic_idle_timeout``). ``max_resumes``: cuts one stream may survive."""
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
        self._host = parts.hostname
        default_port = 443 if parts.scheme == "https" else 80
        self._tcp_port = parts.port or default_port
        self._origin = f"{parts.scheme}://{parts.hostname}:{self._tcp_port}"
        self._h3_port = h3_port
        self._prefix = parts.path.rstrip("/")
        self._h3: Http3ClientConnection | None = None
        self._draining: set[Http3ClientConnection] = set()
        """Connections whose server drains (it refused a new stream): their streams go on, new ones go elsewhere."""
        self._h3_lock = asyncio.Lock()
        self._http = http_client
        self._own_http = http_client is None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- paths ---------------------------------------------------------------------------------------------
    @property
    def h3_port(self) -> int:
        """The UDP port HTTP/3 is tried on now."""
        return self._h3_port or self.memory.h3_port(self._origin) or self._tcp_port

    async def connection(self) -> Http3ClientConnection:
        """The HTTP/3 connection, opened on first use and reopened if it closed; raises ``ConnectError``."""
        conn = await self._h3_connection(probe=False)
        assert conn is not None
        return conn

    async def _h3_connection(self, *, probe: bool) -> Http3ClientConnection | None:
        """``probe`` (``auto``): None instead of an error when UDP does not answer (the path is remembered as
        broken); a TLS failure is raised either way, since falling back would hide it."""
        async with self._h3_lock:
            if self._h3 is not None and not self._h3.closed:
                return self._h3
            port = self.h3_port
            if probe and self.memory.is_broken(self._host, port):
                return None
            try:
                self._h3 = await Http3ClientConnection.connect(
                    self._host, port, verify=self.verify, timeout=self.h3_probe_timeout if probe else self.timeout,
                    limits=self.limits, idle_timeout=self.quic_idle_timeout,
                    stream_idle_timeout=self.stream_idle_timeout)
            except TLSVerificationError:
                raise
            except ConnectError:
                if not probe:
                    raise
                self.memory.mark_broken(self._host, port, self.udp_retry_after)
                return None
            self._h3.abort_unanswered = self.transport == "auto"
            self.memory.mark_working(self._host, port)
            return self._h3

    def _udp_failed(self) -> None:
        """A request over HTTP/3 got no head: under ``auto``, UDP is not to be relied on for a while. (A cut
        stream only resumes: its resume probes UDP again, so a path that came back is used.)"""
        if self.transport == "auto":
            self.memory.mark_broken(self._host, self.h3_port, self.udp_retry_after)

    async def _http_client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(verify=self.verify, timeout=httpx.Timeout(self.timeout, read=None))
        return self._http

    def _learn(self, headers: Mapping[str, str]) -> None:
        self.memory.learn(self._origin, headers.get(ALT_SVC_HEADER.decode()))

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
            except StreamBroken as exc:
                # Closed cleanly by the server before the head came (it drained, then exited): nothing was
                # started for this request there. Try again on a new connection.
                ours = [c for c in (self._h3, *self._draining) if c is not None and c.closed]
                clean = any(c.close_event is not None and c.close_event.error_code in (0, H3_NO_ERROR) for c in ours)
                if tcp_only or not clean or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
                continue
            except HTTPStatusError as exc:
                conn = self._h3
                if (not _draining(exc) or tcp_only or conn is None or conn.closed
                        or time.monotonic() > deadline):
                    raise
                async with self._h3_lock:
                    if self._h3 is conn:
                        self._h3 = None
                        self._draining.add(conn)
                if self.transport == "auto":
                    tcp_only = True
                else:
                    await asyncio.sleep(min(_retry_after(exc), max(0.0, deadline - time.monotonic())))

    async def _open(self, method: str, path: str, body: bytes, merged: dict[str, str], *, offset: int = 0,
                    last_event_id: str | None = None, tcp_only: bool = False) -> Attempt | None:
        """One try: HTTP/3 when the transport allows and (``auto``) UDP answers, else SSE over TCP."""
        resuming = last_event_id is not None
        if resuming:
            merged = {**merged, "last-event-id": last_event_id}  # type: ignore[dict-item]
        if self.transport != "sse" and not tcp_only:
            conn = await self._h3_connection(probe=self.transport == "auto")
            if conn is not None:
                try:
                    return await open_h3(conn, method, self._prefix + path, self._h3_headers(merged), body,
                                         eloquent=self.transport in ("auto", "eloquent"), offset=offset,
                                         timeout=self.timeout, resuming=resuming)
                except StreamBroken:
                    if self.transport != "auto":
                        raise
                    self._udp_failed()  # connected, but the request got no answer: take TCP
        try:
            attempt = await open_sse(await self._http_client(), method, self.base_url + path, merged, body,
                                     offset=offset, resuming=resuming)
        except ConnectError:
            if self.transport != "auto":
                raise
            # Nothing on TCP either: the server may speak HTTP/3 only and just be slow to answer (a loaded box).
            # Give UDP the whole timeout before giving up.
            self.memory.mark_working(self._host, self.h3_port)
            conn = await self._h3_connection(probe=False)
            assert conn is not None
            return await open_h3(conn, method, self._prefix + path, self._h3_headers(merged), body, eloquent=True,
                                 offset=offset, timeout=self.timeout, resuming=resuming)
        if attempt is not None:
            self._learn(attempt.headers)
        return attempt

    async def _resume(self, method: str, path: str, body: bytes, merged: dict[str, str], token: str,
                      next_index: int, cause: BaseException) -> Attempt | None:
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

    async def _events(self, state: StreamState, method: str, path: str, body: bytes,
                      merged: dict[str, str]) -> AsyncIterator[Any]:
        while True:
            attempt = state.attempt
            try:
                async for index, event in attempt.events():
                    if index < state.next_index:
                        continue  # already rendered (a resume replays from the id it was given)
                    token = state.token
                    if event.index != index or (event.id is None and token is not None):
                        event = dataclasses.replace(event, index=index,
                                                    id=event.id or (f"{token}:{index}" if token else None))
                    state.next_index = index + 1
                    yield event
                return
            except _RESUMABLE as exc:
                await attempt.aclose()
                if not self.resume or state.token is None:
                    raise
                if state.resumes >= self.max_resumes:
                    raise StreamBroken(f"stream {state.token} was cut {state.resumes + 1} times; giving up: {exc}") \
                        from exc
                state.resumes += 1
                attempt_or_none = await self._resume(method, path, body, merged, state.token, state.next_index, exc)
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
        """A non-streaming request: over HTTP/3 when the transport allows and (``auto``) UDP answers, else TCP."""
        body, merged = self._body(json, content, headers)
        conn = None if self.transport == "sse" else await self._h3_connection(probe=self.transport == "auto")
        if conn is None:
            client = await self._http_client()
            try:
                r = await client.request(method, self.base_url + path, content=body, headers=merged)
            except httpx.ConnectError as exc:
                if self.transport != "auto":
                    raise ConnectError(f"cannot connect to {self._origin}: {exc}") from exc
                self.memory.mark_working(self._host, self.h3_port)  # as in ``_open``: UDP gets the whole timeout
                conn = await self._h3_connection(probe=False)
            except httpx.TransportError as exc:
                raise StreamBroken(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
            else:
                self._learn(r.headers)
                return Response(r.status_code, dict(r.headers), r.content, "sse")
        assert conn is not None
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
        if self._h3 is not None:
            await self._h3.close()
            self._h3 = None
        draining, self._draining = self._draining, set()
        for conn in draining:
            await conn.close()
        if self._http is not None and self._own_http:
            await self._http.aclose()
            self._http = None


def _draining(exc: HTTPStatusError) -> bool:
    """A server's refusal of a new stream because it drains (``transports.drain``): safe to send elsewhere."""
    error = exc.body.get("error") if exc.status == 503 and isinstance(exc.body, dict) else None
    return isinstance(error, dict) and error.get("code") == "draining"


def _retry_after(exc: HTTPStatusError) -> float:
    try:
        return min(5.0, max(0.0, float(exc.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


AsyncEloquentClient = EloquentClient

__all__ = ["TRANSPORTS", "AsyncEloquentClient", "EloquentClient", "HTTPStatusError", "Response", "ResponseStream",
           "Transport"]
