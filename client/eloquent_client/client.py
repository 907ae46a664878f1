# long: one stream across its paths (the TCP/QUIC race, the move to datagrams, resume) is one piece of logic;
# its parts live in attempts.py, handshakes.py and paths.py
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
    ALT_SVC_HEADER,
    DATAGRAM,
    H3_NO_ERROR,
    SCHEME_HEADER,
    STREAM_HEADER,
    TRANSPORT_HEADER,
)

from eloquent_client.attempts import CONNECT_ERRORS, TRANSPORT_ERRORS, Attempt, open_h3, open_sse
from eloquent_client.bounds import alt_svc_port
from eloquent_client.errors import (
    ClientError,
    ConnectError,
    HTTPStatusError,
    IncompleteStream,
    ResumeRefused,
    StreamBroken,
    TLSVerificationError,
)
from eloquent_client.handshakes import handshakes
from eloquent_client.http3 import Http3ClientConnection
from eloquent_client.pacing import Pacing
from eloquent_client.paths import DEFAULT_UDP_RETRY_AFTER, SHARED, PathMemory
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
        self._host = parts.hostname
        default_port = 443 if parts.scheme == "https" else 80
        self._tcp_port = parts.port or default_port
        self._origin = f"{parts.scheme}://{parts.hostname}:{self._tcp_port}"
        self._h3_port = h3_port
        self._alt_svc_ports = tuple(alt_svc_ports or ())
        self._prefix = parts.path.rstrip("/")
        self._h3: Http3ClientConnection | None = None
        self._draining: set[Http3ClientConnection] = set()
        """Connections whose server drains (it refused a new stream): their streams go on, new ones go elsewhere."""
        self._h3_lock = asyncio.Lock()
        self._h3_task: asyncio.Task[Http3ClientConnection] | None = None
        """``auto``'s QUIC handshake, racing TCP (``_race``)."""
        self._h3_started = 0.0
        self._h3_task_port = 0
        self._tls_error: TLSVerificationError | None = None
        """A background handshake's TLS failure, raised by the next request (never hidden behind TCP)."""
        self._http = http_client
        self._own_http = http_client is None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- paths ----------------------------------------------------------------------------------------------
    @property
    def h3_port(self) -> int:
        """The UDP port HTTP/3 is tried on now."""
        learned = alt_svc_port(self.memory.h3_port(self._origin), self._tcp_port, self._alt_svc_ports, self.verify)
        return self._h3_port or learned or self._tcp_port

    def _h3_up_now(self) -> Http3ClientConnection | None:
        return self._h3 if self._h3 is not None and not self._h3.closed else None

    async def connection(self) -> Http3ClientConnection:
        """The HTTP/3 connection, opened on first use (with the whole ``timeout``) and reopened if it closed;
        raises ``ConnectError``."""
        async with self._h3_lock:
            conn = self._h3_up_now()
            task = self._h3_task
            if conn is None and task is not None and not task.done():  # ``auto``'s handshake is under way
                with contextlib.suppress(ConnectError):
                    await asyncio.shield(task)
                conn = self._h3_up_now()
            if conn is None:
                conn = self._h3 = await self._connect_h3(self.h3_port)
            return conn

    async def _connect_h3(self, port: int, timeout: float | None = None) -> Http3ClientConnection:
        conn = await Http3ClientConnection.connect(
            self._host, port, verify=self.verify, timeout=timeout or self.timeout, limits=self.limits,
            idle_timeout=self.quic_idle_timeout, stream_idle_timeout=self.stream_idle_timeout)
        conn.abort_unanswered = self.transport == "auto"
        return conn

    def _race(self) -> asyncio.Task[Http3ClientConnection] | None:
        """``auto``: the QUIC handshake, started in the background unless it runs already or the path is
        remembered as blocked. It gets the whole ``timeout``: a handshake that lost packets retransmits and comes
        up (a stream that began on TCP then moves over); only one that never hears back marks the path blocked."""
        task = self._h3_task
        port = self.h3_port
        if task is not None and not task.done():
            if port == self._h3_task_port:
                return task
            task.cancel()  # the origin advertised another UDP port meanwhile (``Alt-Svc``)
        if self.memory.is_broken(self._host, port):
            return None
        self._h3_task = task = asyncio.get_running_loop().create_task(self._handshake(port))
        task.add_done_callback(_retrieve)
        self._h3_task_port = port
        self._h3_started = time.monotonic()
        return task

    async def _handshake(self, port: int) -> Http3ClientConnection:
        try:
            conn = await handshakes(lambda timeout: self._connect_h3(port, timeout), self.timeout)
        except TLSVerificationError as exc:
            self._tls_error = exc
            raise
        except ConnectError as exc:
            if not exc.answered:  # nothing ever came back: UDP is blocked on this path
                self.memory.mark_broken(self._host, port, self.udp_retry_after)
            raise
        self.memory.mark_working(self._host, port)
        if self._h3_up_now() is not None:  # ``connection()`` made one meanwhile
            await conn.close()
            return self._h3  # type: ignore[return-value]
        if self._h3 is not None:  # one that closed: its successor takes over
            await self._h3.close()
        self._h3 = conn
        return conn

    async def _h3_up(self) -> Http3ClientConnection | None:
        """The HTTP/3 connection to use now, or None for TCP: under ``auto`` QUIC gets ``h3_probe_timeout`` of
        head start from the handshake's start, then TCP is used beside it (the race, ``_open``); the explicit
        HTTP/3 transports connect (and raise); ``sse`` never. A TLS failure is raised, never hidden."""
        if self.transport == "sse":
            return None
        if self.transport != "auto":
            return await self.connection()
        if self._tls_error is not None:
            error, self._tls_error = self._tls_error, None
            raise error
        conn = self._h3_up_now()
        if conn is not None:
            return conn
        task = self._race()
        if task is None:
            return None
        head_start = self._h3_started + self.h3_probe_timeout - time.monotonic()
        if not task.done() and head_start > 0:
            await asyncio.wait({task}, timeout=head_start)
        return self._raced(task)

    def _raced(self, task: asyncio.Task[Http3ClientConnection]) -> Http3ClientConnection | None:
        if not task.done() or task.cancelled():
            return None
        error = task.exception()
        if isinstance(error, TLSVerificationError):
            self._tls_error = None
            raise error
        return self._h3_up_now() if error is None else None

    def _tcp_refused(self) -> Http3ClientConnection | None:
        """TCP said no (refused, unreachable): the connection if QUIC is already up, else None -- and the
        handshake is given up, since the server is not there (fast failure: TCP's answer is the signal)."""
        conn = self._h3_up_now()
        if conn is not None:
            return conn
        task = self._h3_task
        if task is not None and not task.done():
            task.cancel()
        return None

    async def h3_if_up(self) -> Http3ClientConnection | None:
        """For a non-streaming request of the httpx transports: as ``_h3_up``."""
        return await self._h3_up()

    async def h3_after_tcp_failed(self, exc: BaseException) -> Http3ClientConnection | None:
        """A non-streaming request's TCP connect failed with ``exc``: the HTTP/3 connection if it is up."""
        return self._tcp_refused() if self.transport == "auto" else None

    def _udp_failed(self) -> None:
        """A request over HTTP/3 got no head (the watchdog found the path silent): under ``auto``, UDP is skipped
        for a while (backing off, ``paths``). A cut stream only resumes: its resume races UDP again."""
        if self.transport == "auto":
            self.memory.mark_broken(self._host, self.h3_port, self.udp_retry_after)

    async def _http_client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(verify=self.verify, timeout=httpx.Timeout(self.timeout, read=None))
        return self._http

    def _learn(self, headers: Mapping[str, str]) -> None:
        """Read ``Alt-Svc``; under ``auto`` a newly advertised UDP port gets its handshake at once, so the stream
        that brought the header can move over to it."""
        before = self.h3_port
        self.memory.learn(self._origin, headers.get(ALT_SVC_HEADER.decode()))
        if self.transport == "auto" and self.h3_port != before and self._h3_up_now() is None:
            self._race()

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
                ours = [c for c in (self._h3, *self._draining) if c is not None and c.closed]
                clean = any(_closed_on_purpose(c.close_event) for c in ours)
                if tcp_only or not clean or time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
                continue
            except HTTPStatusError as exc:
                conn = self._h3
                if not _draining(exc) or tcp_only or time.monotonic() > deadline:
                    raise
                async with self._h3_lock:
                    # The draining connection may be closed already (the drain ended): a new one either way.
                    if conn is not None and self._h3 is conn:
                        self._h3 = None
                        if not conn.closed:
                            self._draining.add(conn)
                if self.transport == "auto":
                    tcp_only = True
                else:
                    await asyncio.sleep(min(_retry_after(exc), max(0.0, deadline - time.monotonic())))

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

        conn = None if tcp_only else await self._h3_up()
        if conn is not None:
            try:
                return await over_h3(conn)
            except StreamBroken:
                if self.transport != "auto":
                    raise
                self._udp_failed()  # connected, but the request got no answer: take TCP
        sse = asyncio.ensure_future(open_sse(await self._http_client(), method, self.base_url + path, merged, body,
                                             offset=offset, resuming=resuming))
        task = self._h3_task if self.transport == "auto" and conn is None and not tcp_only else None
        try:
            if task is not None and not task.done():
                await asyncio.wait({sse, task}, return_when=asyncio.FIRST_COMPLETED)
                if not sse.done() and self._raced(task) is not None:
                    await asyncio.wait({sse}, timeout=self.h3_probe_timeout)
                    if not sse.done():  # QUIC is up and TCP still silent: the request goes over HTTP/3
                        sse.cancel()
                        with contextlib.suppress(BaseException):
                            await sse
                        conn = self._h3_up_now()
                        if conn is not None:
                            return await over_h3(conn)
            attempt = await sse
        except ConnectError:
            conn = self._tcp_refused() if self.transport == "auto" and not tcp_only else None
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
                or event.kind != "data" or event.data == "[DONE]" or self._h3_up_now() is None):
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
        conn = await self._h3_up()
        if conn is None:
            client = await self._http_client()
            try:
                r = await client.request(method, self.base_url + path, content=body, headers=merged)
            except CONNECT_ERRORS as exc:
                conn = self._tcp_refused() if self.transport == "auto" else None
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
        task, self._h3_task = self._h3_task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        if self._h3 is not None:
            await self._h3.close()
            self._h3 = None
        draining, self._draining = self._draining, set()
        for conn in draining:
            await conn.close()
        if self._http is not None and self._own_http:
            await self._http.aclose()
            self._http = None


_APPLICATION_ERROR, _PADDING = 0x0C, 0x00
"""RFC 9000 10.2.3: a close an application sends before the handshake is confirmed goes out as a transport close,
APPLICATION_ERROR with frame type PADDING, its own code hidden."""


def _closed_on_purpose(event: Any) -> bool:
    """The server closed the connection itself (no transport error): a drained replica's ``H3_NO_ERROR``, or its
    exit closing a connection still young enough that QUIC hid the code."""
    if event is None:
        return False
    if event.error_code in (0, H3_NO_ERROR):
        return True
    return bool(event.error_code == _APPLICATION_ERROR and event.frame_type == _PADDING)


def _draining(exc: HTTPStatusError) -> bool:
    """A server's refusal of a new stream because it drains (``transports.drain``): safe to send elsewhere."""
    error = exc.body.get("error") if exc.status == 503 and isinstance(exc.body, dict) else None
    return isinstance(error, dict) and error.get("code") == "draining"


def _retry_after(exc: HTTPStatusError) -> float:
    try:
        return min(5.0, max(0.0, float(exc.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


def _retrieve(task: asyncio.Task[Any]) -> None:
    """A background handshake's failure is read where it matters (``_raced``); this keeps asyncio quiet."""
    if not task.cancelled():
        task.exception()


AsyncEloquentClient = EloquentClient

__all__ = ["TRANSPORTS", "AsyncEloquentClient", "EloquentClient", "HTTPStatusError", "Response", "ResponseStream",
           "Transport"]
