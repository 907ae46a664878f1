"""One HTTP/3 request: the ASGI bridge (``receive``/``send``/``run``) and its response, plain or Eloquent.

The request owns its lifecycle (``RequestState``) and what goes on its stream; the connection owns the wire and the
datagram scheduler, seen here only as ``RequestHost`` (so a request can be built and tested on its own). Every JSON
error body comes from the route's codec, so a TGI or Triton route answers in its own format.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any, Protocol

from eloquent_plugins.core.codecs.base import Codec
from eloquent_plugins.core.errors import LimitExceeded
from eloquent_plugins.core.events import StreamEvent
from eloquent_plugins.core.hooks.manager import StreamHooks
from eloquent_plugins.core.keepalive import KeepAliveTimer
from eloquent_plugins.core.protocol import (DATAGRAM, H3_INTERNAL_ERROR, H3_NO_ERROR, H3_REQUEST_CANCELLED,
                                            REQUEST_ID_HEADER, TRANSPORT_HEADER)
from eloquent_plugins.core.response_stream import EloquentResponseStream
from eloquent_plugins.core.pacing import next_tick
from eloquent_plugins.core.padding import REQUEST_HEAD_MAX
from eloquent_plugins.core.scheme import Scheme
from eloquent_plugins.core.sender_config import SenderConfig
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.core.sse_writer import format_event
from eloquent_plugins.h3glue.common import CONNECTION_SPECIFIC
from eloquent_plugins.transports.access_log import request_line
from eloquent_plugins.transports.asgi import HOOKS_EXTENSION
from eloquent_plugins.transports.http3.guards import STREAM_HIGH_WATER, BodyGuard, Rejection
from eloquent_plugins.transports.http3.lifecycle import RequestState
from eloquent_plugins.transports.http3.state import ServerState

log = logging.getLogger("eloquent_plugins.transports.http3")

_SSE_SLACK = 4096
"""Bytes an SSE message may take beyond its event payload (field names, id, event type)."""


class RequestHost(Protocol):
    """What a request needs of the connection it runs on (``Http3Connection``): the shared state, the loop, the
    wire of its own stream, and the datagram pump. Nothing else of the connection is the request's business."""

    state: ServerState
    error_code: int | None
    """Set when the connection failed (closed by us with that code)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...
    @property
    def terminated(self) -> bool: ...
    @property
    def negotiated(self) -> bool: ...  # HTTP/3 is up: a response can go out
    @property
    def peer_accepts_datagrams(self) -> bool: ...

    # the wire of the request's own stream
    def send_headers(self, stream_id: int, headers: list[tuple[bytes, bytes]], end_stream: bool = False) -> bool: ...
    def send_data(self, stream_id: int, data: bytes, end_stream: bool) -> bool: ...
    def reset(self, stream_id: int, code: int) -> None: ...
    def stop_reading(self, stream_id: int, code: int = H3_NO_ERROR) -> None: ...
    def backlog(self, stream_id: int) -> int: ...
    def sender_config(self, scheme: Scheme, codec: str, body_head: bytearray | None) -> SenderConfig: ...
    def transmit(self) -> None: ...

    # the datagram pump, and the connection's book of its requests
    def track_eloquent(self, request: Request) -> None: ...
    def pump_stream(self, stream_id: int) -> None: ...
    def pump_soon(self) -> None: ...
    def request_done(self, request: Request) -> None: ...
    def forget(self, request: Request) -> None: ...


class Request:
    def __init__(self, conn: RequestHost, stream_id: int, scope: dict[str, Any], scheme: Scheme,
                 codec: Codec) -> None:
        self.conn, self.stream_id, self.scope, self.scheme = conn, stream_id, scope, scheme
        self.codec = codec
        """The route's codec: the shape of every JSON error this request may get."""
        self.request_id = os.urandom(8).hex()
        self.state = RequestState.PENDING
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.body = BodyGuard(conn.state.config, conn.loop.time(), conn.state.held)
        self.eloquent: EloquentResponseStream | None = None
        self.sse: SSEParser | None = None
        self.generated: list[float] = []
        self.hooks: StreamHooks | None = None
        self.task: asyncio.Task[None] | None = None
        self.drained = asyncio.Event()
        self.drained.set()
        self._next_index = 0
        self.tail = b"\n\n"
        """The app's last bytes forwarded on a plain SSE response: a keep-alive may only go between messages."""
        self.keepalive: KeepAliveTimer | None = None
        self._keepalive_handle: asyncio.TimerHandle | None = None
        self._body_handle: asyncio.TimerHandle | None = None
        self.body_head: bytearray | None = bytearray() if conn.state.config.padding != "off" else None
        """With ``--padding`` on, the body's start: ``include_obfuscation: false`` turns padding off (``declined``)."""

    @property
    def gone(self) -> bool:
        return self.state is RequestState.DISCONNECTED

    def _finish(self) -> None:
        if self.state in (RequestState.PENDING, RequestState.STARTED):
            self.state = RequestState.FINISHED

    # ---- ASGI --------------------------------------------------------------------------------------------
    async def receive(self) -> dict[str, Any]:
        if self.gone and self.messages.empty():
            return {"type": "http.disconnect"}
        return await self.messages.get()

    def disconnect(self) -> None:
        self.cancel_timers()
        self.body.release()  # what the body held is freed on every way out (its chunks go with the app's task)
        if not self.gone:
            self.state = RequestState.DISCONNECTED
            self.messages.put_nowait({"type": "http.disconnect"})
            self.drained.set()

    def cancel_timers(self) -> None:
        self.cancel_body_timer()
        if self._keepalive_handle is not None:
            self._keepalive_handle.cancel()
            self._keepalive_handle = None

    def cancel_body_timer(self) -> None:
        if self._body_handle is not None:
            self._body_handle.cancel()
            self._body_handle = None

    def on_body(self, data: bytes, ended: bool) -> None:
        if self.body.done:
            return
        refused = self.body.feed(len(data), ended, self.conn.loop.time())
        if refused is not None:
            self.refuse_body(refused)
            return
        if ended:
            self.cancel_body_timer()
        head = self.body_head
        if head is not None and len(head) < REQUEST_HEAD_MAX:
            head += data
        self.messages.put_nowait({"type": "http.request", "body": data, "more_body": not ended})

    async def send(self, message: dict[str, Any]) -> None:
        if self.state in (RequestState.FINISHED, RequestState.DISCONNECTED):
            return  # like uvicorn: sends after a disconnect are dropped, receive() reports it
        kind = message["type"]
        if kind == "http.response.start":
            if self.state is RequestState.STARTED:
                raise RuntimeError("http.response.start sent twice")
            self.state = RequestState.STARTED
            self.start_response(int(message["status"]), list(message.get("headers", [])))
        elif kind == "http.response.body":
            if self.state is RequestState.PENDING:
                raise RuntimeError("http.response.body before http.response.start")
            await self.send_body(bytes(message.get("body", b"")), bool(message.get("more_body")))

    async def run(self) -> None:
        try:
            await self.conn.state.app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("ASGI app failed on stream %d", self.stream_id)
            if self.hooks is not None:
                self.hooks.error(exc)
            self.app_failed(exc)
        else:
            if self.state is RequestState.STARTED and not (self.conn.terminated or self.gone and self.eloquent is None):
                # Started, unfinished (a drain's hand-over): a cut the client resumes, as uvicorn's mid-body close.
                self.conn.reset(self.stream_id, H3_REQUEST_CANCELLED)
                self._finish()
            elif self.state is RequestState.PENDING:
                self.reject(Rejection(500, "the app returned no response", "internal_error"))
        finally:
            self.conn.request_done(self)

    def next_index(self) -> int:
        self._next_index += 1
        return self._next_index - 1

    # ---- the request body's deadline ---------------------------------------------------------------------
    def arm_body_timer(self) -> None:
        """Slowloris on the request side: a body stalled for ``body_timeout`` or under ``body_min_rate`` is refused."""
        deadline = self.body.deadline()
        if deadline is not None:
            self._body_handle = self.conn.loop.call_at(deadline, self._check_body)

    def _check_body(self) -> None:
        self._body_handle = None
        if self.body.done or self.state not in (RequestState.PENDING, RequestState.STARTED) or self.conn.terminated:
            return
        deadline = self.body.deadline()
        if deadline is not None and self.conn.loop.time() < deadline:
            self._body_handle = self.conn.loop.call_at(deadline, self._check_body)
            return
        self.refuse_body(self.body.stalled(self.conn.loop.time()))

    def refuse_body(self, refusal: Rejection) -> None:
        """The body may not go on (over a limit, stalled, too slow): stop reading it, answer the refusal."""
        started = self.state is not RequestState.PENDING
        log.info("stream %d: %s: %s", self.stream_id, refusal.message, "cut" if started else refusal.status)
        self.conn.stop_reading(self.stream_id, H3_REQUEST_CANCELLED if started else H3_NO_ERROR)
        self.reject(refusal)

    # ---- the response ------------------------------------------------------------------------------------
    def reject(self, refusal: Rejection) -> None:
        """An error response before the app answered (or instead of it); a reset once it had started."""
        conn = self.conn
        if self.state is not RequestState.PENDING or not conn.negotiated or conn.terminated:
            conn.reset(self.stream_id, H3_REQUEST_CANCELLED)
        else:
            self.state = RequestState.STARTED
            body = self.codec.error_payload(refusal.message, error_type=refusal.error_type, status=refusal.status,
                                            code=refusal.code)
            headers = [(b":status", str(refusal.status).encode()), (b"content-type", b"application/json"),
                       (b"content-length", str(len(body)).encode()), *refusal.extra_headers()]
            request_line(self.scope, refusal.status)
            if conn.send_headers(self.stream_id, headers):
                conn.send_data(self.stream_id, body, True)
            conn.transmit()
        self._finish()
        self.disconnect()
        if self.task is None:
            conn.forget(self)

    def start_response(self, status: int, raw_headers: list[Any]) -> None:
        conn = self.conn
        if self.scope["extensions"].get(HOOKS_EXTENSION, {}).get("claimed"):
            self.hooks = None  # the app's EloquentMiddleware fires them for this stream (``HOOKS_EXTENSION``)
        headers = [(bytes(k).lower(), bytes(v)) for k, v in raw_headers]
        content_type = next((v for k, v in headers if k == b"content-type"), b"")
        is_sse = content_type.split(b";")[0].strip().lower() == b"text/event-stream"
        out = [(k, v) for k, v in headers if k not in CONNECTION_SPECIFIC and not k.startswith(b":")]
        out.append((REQUEST_ID_HEADER, self.request_id.encode()))
        config = conn.state.config
        if self.scheme is not Scheme.STREAM and status == 200 and is_sse and conn.peer_accepts_datagrams:
            self.eloquent = self._open_eloquent()
            conn.track_eloquent(self)
            out = [(k, v) for k, v in out if k not in (b"content-length", b"content-type")]
            out += [(TRANSPORT_HEADER, DATAGRAM), (b"content-type", b"application/x-ndjson"),
                    (b"eloquent-content-type", content_type)]
            if self.hooks is not None:
                self.hooks.stream.transport = "eloquent"
        elif is_sse:
            self.sse = SSEParser(max_message_bytes=config.limits.max_event_bytes + _SSE_SLACK)
            self._start_keepalive()
        if self.hooks is not None:
            self.hooks.start()
        request_line(self.scope, status)  # uvicorn's access line, as TCP requests get
        conn.send_headers(self.stream_id, [(b":status", str(status).encode()), *out])
        conn.transmit()

    def _open_eloquent(self) -> EloquentResponseStream:
        conn = self.conn
        config = conn.sender_config(self.scheme, self.codec.name, self.body_head)
        return EloquentResponseStream(
            self.stream_id, config, now=conn.loop.time(), fallback_after=conn.state.options.fallback_after,
            ack_timeout=conn.state.config.send_timeout or 30.0, supersede=self.scheme is Scheme.ELOQUENT,
            codec=self.codec, confirm_path=True)

    async def send_body(self, body: bytes, more: bool) -> None:
        conn = self.conn
        now = conn.loop.time()
        stream = self.eloquent
        if stream is not None:
            hooks = self.hooks
            transform = self._hooked_payload if hooks is not None and hooks.active else None
            try:
                stream.feed_body(body, now, transform)
            except (LimitExceeded, ValueError) as exc:
                self.finish_eloquent(stream.fail(str(exc), now))
                if hooks is not None:
                    hooks.end("error")
                raise
            if more:
                conn.pump_stream(self.stream_id)  # at once: a token waiting for the next loop turn renders late
                return
            trailer = stream.finish(now)
            if tick := conn.state.config.send_tick:  # the trailer leaves with the final run, on the tick
                conn.pump_stream(self.stream_id)
                await asyncio.sleep(next_tick(now, tick) - now)
                if self.gone or conn.terminated:
                    return
            self.finish_eloquent(trailer)
            if hooks is not None:
                hooks.end("complete")
            conn.pump_stream(self.stream_id)
            return
        if self.sse is not None:
            messages = self.sse.feed(body)
            self.generated.extend(now for _ in messages)
            if self.hooks is not None and self.hooks.active:
                body = b"".join(self._hooked_sse(m) for m in messages)
        conn.send_data(self.stream_id, body, not more)
        conn.transmit()
        if body:
            self.tail = (self.tail + body)[-4:]
        if self._keepalive_handle is not None and self.keepalive is not None:
            self.keepalive.activity(now)
        if not more:
            self._finish()
            if not self.body.done:  # answered before the whole request arrived: the rest is not wanted
                self.body.release()
                conn.stop_reading(self.stream_id)
            conn.state.record(self.request_id, self.generated)
            if self.hooks is not None:
                self.hooks.end("complete")
            self.disconnect()  # the response is complete: receive() now reports the end
            return
        await self._wait_drained()

    def _hooked_payload(self, index: int, payload: bytes) -> bytes:
        assert self.hooks is not None
        return self.hooks.event(StreamEvent(index, payload)).payload

    def _hooked_sse(self, message: Any) -> bytes:
        assert self.hooks is not None
        event = self.hooks.event(StreamEvent(self.next_index(), message.data.encode()))
        return format_event(event.payload, event=None if message.event == "message" else message.event,
                            id=message.id)

    def finish_eloquent(self, trailer: bytes) -> None:
        self._finish()
        self.conn.state.record(self.request_id, self.eloquent.generated if self.eloquent else [])
        self.conn.send_data(self.stream_id, trailer, False)
        self.conn.transmit()
        self.disconnect()  # the response is complete: receive() now reports the end

    async def _wait_drained(self) -> None:
        """Backpressure on a plain response: wait while the client leaves too much unread."""
        conn = self.conn
        timeout = conn.state.config.send_timeout
        while not self.gone and conn.backlog(self.stream_id) > STREAM_HIGH_WATER:
            self.drained.clear()
            try:
                await asyncio.wait_for(self.drained.wait(), timeout or None)
            except TimeoutError:
                log.info("stream %d: client read nothing for %.1f s; cutting it", self.stream_id, timeout)
                conn.reset(self.stream_id, H3_REQUEST_CANCELLED)
                self.disconnect()

    def app_failed(self, error: BaseException) -> None:
        conn = self.conn
        if conn.terminated or self.gone and self.eloquent is None:
            return
        if self.state is RequestState.PENDING:
            self.reject(Rejection(500, "internal server error", "internal_error"))
            return
        stream = self.eloquent
        if stream is not None:
            if not stream.ended:
                self.finish_eloquent(stream.fail(f"{type(error).__name__}: {error}", conn.loop.time()))
                conn.pump_soon()
            return
        if self.sse is not None and conn.negotiated and self.state is RequestState.STARTED:
            # An in-band error event after the 200, in the route's format (vLLM does the same for OpenAI).
            payload = self.codec.error_payload("internal server error", error_type="InternalServerError",
                                               status=500)
            conn.send_data(self.stream_id, format_event(payload), True)
            self._finish()
            conn.transmit()
        else:
            conn.reset(self.stream_id, H3_INTERNAL_ERROR)
        self._finish()

    # ---- keep-alive on a plain SSE response --------------------------------------------------------------
    def _start_keepalive(self) -> None:
        """The policy's SSE frame after ``interval`` s without bytes, so proxies and clients with read timeouts
        see the stream alive (datagram streams have the sender's own KEEPALIVE packets)."""
        policy = self.conn.state.config.keepalive_policy
        if policy.enabled:
            self.keepalive = KeepAliveTimer(policy, self.conn.loop.time())
            self._arm_keepalive()

    def _arm_keepalive(self) -> None:
        deadline = self.keepalive.deadline() if self.keepalive is not None else None
        if deadline is not None and self.state is RequestState.STARTED and not self.conn.terminated:
            self._keepalive_handle = self.conn.loop.call_at(deadline, self._on_keepalive)

    def _on_keepalive(self) -> None:
        self._keepalive_handle = None
        conn = self.conn
        if self.state is not RequestState.STARTED or conn.terminated or conn.error_code is not None:
            return
        assert self.keepalive is not None
        now = conn.loop.time()
        if self.keepalive.due(now):
            # Only between two messages (the app's bytes so far end with a blank line), as the frame leaves it.
            between = self.tail.endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))
            frame = self.keepalive.policy.sse_frame
            if between and conn.send_data(self.stream_id, frame, False):
                conn.transmit()
            self.keepalive.activity(now)
        self._arm_keepalive()
