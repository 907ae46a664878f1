"""``EloquentMiddleware``: robust SSE for any ASGI app (vLLM via ``--middleware``, TGI/Triton gateways, ...).

A pure ASGI middleware. It acts only on ``200 text/event-stream`` responses; everything else passes through byte
for byte, and requests with ``eloquent-transport: datagram`` are not touched at all. For a stream it:

* starts the response at once and sends an SSE comment after each idle ``keepalive`` interval, with headers that
  stop proxies from buffering (``Cache-Control: no-cache``, ``X-Accel-Buffering: no``) and no hop-by-hop ones;
* gives every event an ``id: <token>:<index>`` and keeps the events in a replay store, so a client that
  reconnects with ``Last-Event-ID`` (header, or ``?last_event_id=`` for POST/fetch clients) gets exactly the
  events after it, then the live tail, without a second engine request. Only the caller that started the stream
  may resume it (``identity``, by default a hash of its Authorization / X-API-Key / Api-Key headers);
* decouples the engine from the client: events queued for a slow client go out in one write (optionally with
  OpenAI text deltas merged); a client that leaves and does not come back within ``resume_grace`` seconds still
  aborts the engine request, because the app is shown the client's ``http.disconnect`` then;
* turns an exception from the app after the 200 into an in-band error event in the route's own format;
* optionally bounds the live streams of one caller (``max_streams_per_client``: credentials, else client
  address): one more gets ``429`` with ``Retry-After: 1`` and the app is shown the client as gone;
* counts everything in Prometheus metrics, logs one correlation id per stream, calls the stream hooks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any

import pluggy

from eloquent_plugins.core.codecs.base import Codec
from eloquent_plugins.core.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.hooks.specs import StreamInfo
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.core.hooks.manager import StreamHooks, codecs, create_plugin_manager
from eloquent_plugins.transports.resume import create_store
from eloquent_plugins.transports.resume.base import ResumeStore, StreamMeta
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.transports.sse.connection import Connection
from eloquent_plugins.transports.sse.headers import is_event_stream, json_error, stream_headers
from eloquent_plugins.transports.sse.ids import (
    BadEventId,
    IdentityFunction,
    client_key,
    identity_hash,
    new_stream_id,
    new_token,
    parse_event_id,
    resume_request,
)
from eloquent_plugins.transports.sse.merge import merge_openai
from eloquent_plugins.transports.sse.producer import Producer
from eloquent_plugins.transports.sse.receive import ReceiveRelay
from eloquent_plugins.transports.resume.log import EventsGone, StreamLog

try:  # optional: one span per stream when OpenTelemetry is installed
    from opentelemetry import trace as _otel_trace
except ImportError:  # pragma: no cover - depends on the installation
    _otel_trace = None

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

log = logging.getLogger("eloquent_plugins.transports.sse")

DEFAULT_CODEC_ROUTES: tuple[tuple[str, str], ...] = (
    (r"^/v2/models/[^/]+(/versions/[^/]+)?/generate_stream$", "triton"),
    (r"^/generate_stream$", "tgi"),
    (r"^/generate$", "tgi"),
    (r"^/$", "tgi"),
    (r"", "openai"),
)
"""(path regex, codec name), first match wins: which format an in-band error takes on each route."""

MAX_LAG_EVENTS = 1024
"""A connected client this many events behind makes the app's ``send`` wait (bounded memory per stream)."""
_PRIVATE_LOG_EVENTS = 4 * MAX_LAG_EVENTS
_SSE, _PASS, _REFUSED = 1, 2, 3


class EloquentMiddleware:
    def __init__(self, app: ASGIApp, config: StreamConfig | None = None, *,
                 plugin_manager: pluggy.PluginManager | None = None, store: ResumeStore | None = None,
                 identity: IdentityFunction | None = None, codec_routes: Sequence[tuple[str, str]] | None = None,
                 metrics_path: str | None = "/metrics", registry: Any = None) -> None:
        """``config`` None reads ``StreamConfig.from_env()`` (vLLM's ``--middleware`` passes no arguments).

        ``store`` overrides the one built from ``config.resume_store``; ``identity(scope)`` names the caller a
        resume must match; ``codec_routes`` maps path regexes to codec names for in-band errors;
        ``metrics_path`` serves this middleware's metrics where the app has no such route (None: off);
        ``registry`` is a prometheus ``CollectorRegistry`` to register into instead of a private one.
        """
        self.app = app
        self.config = config if config is not None else StreamConfig.from_env()
        self.pm = plugin_manager if plugin_manager is not None else create_plugin_manager()
        self.codecs: dict[str, Codec] = codecs(self.pm)
        routes = DEFAULT_CODEC_ROUTES if codec_routes is None else tuple(codec_routes)
        for _pattern, name in routes:
            if name not in self.codecs:
                raise ConfigError(f"codec route names unknown codec {name!r} (known: {sorted(self.codecs)})")
        self._routes = [(re.compile(pattern), self.codecs[name]) for pattern, name in routes]
        self._route_cache: dict[str, Codec] = {}
        self.metrics = StreamMetrics(registry)
        self.identity = identity
        self.metrics_path = metrics_path
        self.policy = self.config.keepalive_policy
        if store is None and self.config.resume:
            factories = [f for result in self.pm.hook.eloquent_register_resume_stores() if result for f in result]
            store = create_store(self.config, factories)
        self.store = store if self.config.resume else None
        self.lease_ttl = max(1.0, min(self.config.resume_grace, 10.0))
        self._spans: dict[str, Any] = {}
        self._client_streams: dict[str, int] = {}
        self._tracer = _otel_trace.get_tracer("eloquent_plugins.transports.sse") if _otel_trace is not None else None

    # -- routing ---------------------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        resume_raw: str | None = None
        for name, value in scope["headers"]:
            if name == b"eloquent-transport" and value.strip().lower() == b"datagram":
                await self.app(scope, receive, send)
                return
            if name == b"last-event-id":
                resume_raw = value.decode("latin-1")
        if self.store is not None:
            if resume_raw is None and b"last_event_id=" in scope.get("query_string", b""):
                resume_raw = resume_request(scope)
            if resume_raw is not None:
                await self._resume(scope, receive, send, resume_raw)
                return
        if scope["path"] == self.metrics_path and scope["method"] in ("GET", "HEAD"):
            await self._serve_metrics(scope, receive, send)
            return
        await _Exchange(self, scope, receive, send).run()

    def codec_for(self, path: str) -> Codec:
        codec = self._route_cache.get(path)
        if codec is None:
            codec = next((c for pattern, c in self._routes if pattern.search(path)), self.codecs["openai"])
            if len(self._route_cache) < 1024:
                self._route_cache[path] = codec
        return codec

    def merge_for(self, codec: Codec) -> Callable[[list[bytes]], tuple[list[bytes], int]] | None:
        return merge_openai if self.config.merge_deltas and codec.name == "openai" else None

    # -- per-client stream limit -----------------------------------------------------------------------------

    @property
    def client_streams(self) -> dict[str, int]:
        """Live streams per client key (``ids.client_key``) while ``max_streams_per_client`` is set."""
        return dict(self._client_streams)

    def _take_slot(self, key: str) -> bool:
        count = self._client_streams.get(key, 0)
        if count >= self.config.max_streams_per_client:
            return False
        self._client_streams[key] = count + 1
        return True

    def _release_slot(self, key: str) -> None:
        count = self._client_streams.get(key, 0) - 1
        if count > 0:
            self._client_streams[key] = count
        else:
            self._client_streams.pop(key, None)

    # -- resume ----------------------------------------------------------------------------------------------

    async def _resume(self, scope: Scope, receive: Receive, send: Send, raw: str) -> None:
        assert self.store is not None
        store, metrics = self.store, self.metrics
        try:
            point = parse_event_id(raw)
        except BadEventId as exc:
            metrics.resume("bad_id")
            await _respond(send, *json_error(400, str(exc), "invalid_last_event_id"))
            return
        try:
            source = await store.open(point.token)
        except Exception:
            log.exception("resume store unavailable")
            metrics.resume("store_error")
            await _respond(send, *json_error(503, "the resume store is unavailable; retry shortly",
                                             "resume_store_unavailable", type_="server_error"))
            return
        if source is None:
            metrics.resume("not_found")
            await _respond(send, *json_error(404, "unknown or expired stream: it cannot be resumed; send the "
                                             "request again without Last-Event-ID", "stream_not_found"))
            return
        meta = source.meta
        cursor = point.after + 1
        try:
            if not hmac.compare_digest(meta.owner, identity_hash(scope, self.identity)):
                metrics.resume("forbidden")
                log.warning("stream=%s resume refused: caller differs from the one that started it", meta.stream_id)
                await _respond(send, *json_error(403, "this stream belongs to another caller", "stream_forbidden",
                                                 type_="permission_error"))
                return
            try:
                await source.check(cursor)
            except EventsGone as exc:
                metrics.resume("expired")
                await _respond(send, *json_error(410, f"the events after {point.after} have expired ({exc})",
                                                 "events_expired"))
                return
            except ValueError as exc:
                metrics.resume("bad_id")
                await _respond(send, *json_error(400, str(exc), "invalid_last_event_id"))
                return
            except Exception:
                log.exception("stream=%s resume store unavailable", meta.stream_id)
                metrics.resume("store_error")
                await _respond(send, *json_error(503, "the resume store is unavailable; retry shortly",
                                                 "resume_store_unavailable", type_="server_error"))
                return
            if source.end_reason == "disconnected":
                metrics.resume("aborted")
                await _respond(send, *json_error(410, "this stream was aborted (its client left and nobody resumed "
                                                 "within the grace period); send the request again",
                                                 "stream_aborted"))
                return
            if source.ended(cursor) and not source.take(cursor):
                metrics.resume("finished")
                # 204 tells a browser EventSource to stop reconnecting to a stream that is over.
                await _respond(send, 204, [], b"")
                return
        except BaseException:
            source.close()
            raise
        metrics.resume("ok")
        consumer = new_token()[:12]
        log.info("stream=%s resumed after event %d (connection %s)", meta.stream_id, point.after, consumer)
        span = self._spans.get(point.token)
        own_span = None
        if span is not None:
            span.add_event("connection", {"eloquent.resume_after": point.after})
        elif self._tracer is not None:
            span = own_span = self._tracer.start_span("eloquent.sse.resume", attributes={
                "eloquent.stream_id": meta.stream_id, "eloquent.resume_after": point.after})
        conn = Connection(send, source, cursor, policy=self.policy, send_timeout=self.config.send_timeout,
                          metrics=metrics, merge=self.merge_for(self.codecs.get(meta.codec, self.codecs["openai"])),
                          coalesce=self.config.coalesce,
                          renew_lease=lambda: store.lease(point.token, consumer, self.lease_ttl),
                          lease_every=self.lease_ttl / 3)
        await store.lease(point.token, consumer, self.lease_ttl)
        metrics.active_connections += 1
        reason = "error"
        try:
            await send({"type": "http.response.start", "status": 200, "headers": list(meta.headers)})
            conn.start()
            watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, conn))
            try:
                reason = await conn.finished()
            finally:
                watcher.cancel()
        finally:
            metrics.active_connections -= 1
            with contextlib.suppress(Exception):
                await store.release(point.token, consumer)
            log.info("stream=%s connection %s ended: %s at event %d", meta.stream_id, consumer, reason,
                     conn.cursor - 1)
            if own_span is not None:
                own_span.end()

    # -- metrics ---------------------------------------------------------------------------------------------

    async def _serve_metrics(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The app's own route wins; where it answers 404, this middleware's metrics are served."""
        ours = False

        async def capture(message: Message) -> None:
            nonlocal ours
            if message["type"] == "http.response.start" and message.get("status") == 404:
                ours = True
            if not ours:
                await send(message)

        await self.app(scope, receive, capture)
        if ours:
            body, content_type = self.metrics.render()
            await _respond(send, 200, [(b"content-type", content_type.encode()),
                                       (b"content-length", str(len(body)).encode())],
                           b"" if scope["method"] == "HEAD" else body)


class _Exchange:
    """One request through the middleware: pass-through, or the producer side of a new stream."""

    __slots__ = ("mw", "scope", "send", "relay", "mode", "started", "log", "producer", "conn", "token", "hooks",
                 "info", "abandon", "span", "closing", "slot")

    def __init__(self, mw: EloquentMiddleware, scope: Scope, receive: Receive, send: Send) -> None:
        self.mw = mw
        self.scope = scope
        self.send = send
        self.relay = ReceiveRelay(receive)
        self.mode = 0
        self.started = time.monotonic()
        self.log: StreamLog | None = None
        self.producer: Producer | None = None
        self.conn: Connection | None = None
        self.token: str | None = None
        self.hooks: StreamHooks | None = None
        self.info: StreamInfo | None = None
        self.abandon: asyncio.Task[None] | None = None
        self.span: Any = None
        self.closing = False
        self.slot: str | None = None
        """The client key this stream counts against (``max_streams_per_client``), until released."""

    async def run(self) -> None:
        try:
            await self.mw.app(self.scope, self.relay.receive, self.app_send)
        except Exception as exc:
            if self.mode == _REFUSED:  # the 429 is out; the app failed on being told its client left
                log.debug("refused stream: the app ended with %r", exc)
                return
            if self.mode != _SSE or self.producer is None or self.producer.log.closed:
                raise
            assert self.info is not None
            log.error("stream=%s engine failed after the response started: %r", self.info.stream_id, exc,
                      exc_info=exc)
            self.producer.fail(exc)
        finally:
            self.relay.close()
            try:
                if self.mode == _SSE:
                    await self._finish()
            finally:
                self._release_slot()

    async def app_send(self, message: Message) -> None:
        mode = self.mode
        if mode == _SSE:
            if message["type"] == "http.response.body":
                producer = self.producer
                assert producer is not None
                body = message.get("body", b"")
                if body:
                    conn = self.conn
                    if conn is not None and conn.claim():
                        producer.feed(body)
                        await conn.write_claimed()
                    else:
                        producer.feed(body)
                if not message.get("more_body", False):
                    producer.close("complete")
                else:
                    conn = self.conn
                    if conn is not None:
                        stream_log = producer.log
                        if stream_log.base + len(stream_log.frames) - conn.cursor > MAX_LAG_EVENTS and not conn.gone:
                            await self._backpressure(conn, stream_log)
            return
        if mode == _PASS:
            await self.send(message)
            return
        if mode == _REFUSED:
            return  # the 429 went out; the app is being told the client left
        if (message["type"] == "http.response.start" and message.get("status", 200) == 200
                and is_event_stream(message.get("headers", ()))):
            if not self._admit():
                self.mode = _REFUSED
                await self._refuse()
                return
            self.mode = _SSE
            await self._start(message)
        else:
            self.mode = _PASS
            await self.send(message)

    async def _start(self, message: Message) -> None:
        mw, scope = self.mw, self.scope
        store, metrics = mw.store, mw.metrics
        path = scope.get("path", "")
        codec = mw.codec_for(path)
        stream_id = new_stream_id()
        self.info = StreamInfo(stream_id, route=path, transport="sse", codec=codec.name)
        self.hooks = StreamHooks(mw.pm, self.info)
        token: str | None = None
        stream_log: StreamLog | None = None
        meta: StreamMeta | None = None
        if store is not None:
            token = new_token()
            new_log = getattr(store, "new_log", None)
            stream_log = new_log() if new_log is not None else StreamLog()
            headers = stream_headers(message.get("headers", ()), token=token)
            meta = StreamMeta(stream_id, identity_hash(scope, mw.identity), 200, tuple(headers), path, codec.name,
                              time.time())
            try:
                await store.create(token, meta, stream_log)
            except Exception:
                log.exception("stream=%s resume store unavailable: this stream is not resumable", stream_id)
                token = None
        if token is None:
            store = None
            stream_log = StreamLog(max_events=_PRIVATE_LOG_EVENTS, max_bytes=64 << 20)
            headers = stream_headers(message.get("headers", ()), token=None)
            meta = StreamMeta(stream_id, "", 200, tuple(headers), path, codec.name, time.time())
        assert stream_log is not None and meta is not None
        self.token, self.log = token, stream_log
        self.producer = Producer(stream_log, token=token, hooks=self.hooks, codec=codec, metrics=metrics,
                                 started=self.started)
        metrics.streams_started += 1
        metrics.active_streams += 1
        metrics.active_connections += 1
        log.info("stream=%s started: %s %s (resumable: %s)", stream_id, scope.get("method"), path, token is not None)
        if mw._tracer is not None:
            self.span = mw._tracer.start_span("eloquent.sse.stream", attributes={
                "eloquent.stream_id": stream_id, "http.route": path, "eloquent.codec": codec.name})
            self.span.add_event("connection", {"eloquent.resume_after": -1})
            if token is not None:
                mw._spans[token] = self.span
        self.hooks.start()
        await self.send({"type": "http.response.start", "status": 200, "headers": headers})
        self.conn = Connection(self.send, LocalSource(meta, stream_log), 0, policy=mw.policy,
                               send_timeout=mw.config.send_timeout, metrics=metrics, merge=mw.merge_for(codec),
                               coalesce=mw.config.coalesce)
        task = self.conn.start()
        task.add_done_callback(self._connection_done)
        if store is not None:
            self.relay.hold()
        self.relay.on_gone(self._client_gone)
        self.relay.watch()

    def _admit(self) -> bool:
        """Take a slot of this caller's ``max_streams_per_client`` (always True when unlimited)."""
        mw = self.mw
        if not mw.config.max_streams_per_client:
            return True
        key = client_key(self.scope, mw.identity)
        if not mw._take_slot(key):
            return False
        self.slot = key
        return True

    def _release_slot(self) -> None:
        """Idempotent: the stream ended, or its client left (a resume is not counted again)."""
        if self.slot is not None:
            key, self.slot = self.slot, None
            self.mw._release_slot(key)

    async def _refuse(self) -> None:
        mw = self.mw
        limit = mw.config.max_streams_per_client
        mw.metrics.streams_refused += 1
        log.info("stream refused: %s %s: the caller already holds %d live streams", self.scope.get("method"),
                 self.scope.get("path"), limit)
        self.relay.disconnect()  # the app sees its client gone and stops generating
        status, headers, body = json_error(429, f"too many concurrent streams: at most {limit} per client; retry "
                                           "when one of them has ended", "rate_limit_exceeded", type_="requests")
        await _respond(self.send, status, [*headers, (b"retry-after", b"1")], body)

    def _connection_done(self, task: asyncio.Task[str]) -> None:
        if self.conn is not None and self.conn.timed_out:
            assert self.info is not None
            log.info("stream=%s client accepted no bytes for %.0fs: connection cut", self.info.stream_id,
                     self.mw.config.send_timeout)
            self.relay.disconnect()

    def _client_gone(self) -> None:
        self._release_slot()
        if self.conn is not None:
            self.conn.disconnect()
        if self.token is not None and self.log is not None and not self.log.closed and self.abandon is None:
            self.abandon = asyncio.get_running_loop().create_task(self._watch_abandon())

    async def _watch_abandon(self) -> None:
        """Keep the engine request running while someone may resume; abort it once nobody has read the stream
        (on any replica) for the grace period. Decided from recorded times (the client leaving, lease ends), so a
        late look never mistakes a reader for an absence."""
        mw, stream_log, token = self.mw, self.log, self.token
        assert mw.store is not None and stream_log is not None and token is not None and self.info is not None
        grace = mw.config.resume_grace
        left_at = time.time()
        step = min(0.25, grace / 4)
        while not stream_log.closed:
            if grace > 0:
                await asyncio.sleep(step)
            asked_at = time.time()  # the answer shows the leases as of this moment or later
            try:
                last = await mw.store.last_watched(token)
            except Exception:
                log.exception("stream=%s cannot read resume leases", self.info.stream_id)
                last = None
            if stream_log.closed:
                return
            if asked_at >= max(left_at, last or 0.0) + grace:
                log.info("stream=%s abandoned: no reader for %.1fs, aborting the engine request",
                         self.info.stream_id, grace)
                self.relay.release()
                return

    async def _backpressure(self, conn: Connection, stream_log: StreamLog) -> None:
        while stream_log.next_index - conn.cursor > MAX_LAG_EVENTS // 2 and not conn.gone and not conn.timed_out:
            await asyncio.sleep(0.005)

    async def _finish(self) -> None:
        mw, producer, conn = self.mw, self.producer, self.conn
        if producer is None or self.info is None or self.hooks is None:
            return  # the stream never got going (its start failed); nothing to clean up
        metrics = mw.metrics
        if not producer.log.closed:
            producer.close("disconnected" if self.relay.client_gone else "complete")
        reason = producer.log.reason or "complete"
        if reason == "disconnected":
            metrics.aborts += 1
        if self.abandon is not None:
            self.abandon.cancel()
        conn_reason = "disconnected"
        if conn is not None:
            try:
                conn_reason = await conn.finished()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("stream=%s connection failed", self.info.stream_id)
        metrics.active_connections -= 1
        metrics.active_streams -= 1
        metrics.ended(reason)
        if mw.store is not None and self.token is not None:
            with contextlib.suppress(Exception):
                await mw.store.finish(self.token)
        self.hooks.end(reason)
        log.info("stream=%s ended: %s after %d events (first connection: %s)", self.info.stream_id, reason,
                 producer.events, conn_reason)
        if self.span is not None:
            self.span.set_attribute("eloquent.end_reason", reason)
            self.span.end()
            if self.token is not None:
                mw._spans.pop(self.token, None)


async def _watch_disconnect(receive: Receive, conn: Connection) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    conn.disconnect()


async def _respond(send: Send, status: int, headers: Iterable[tuple[bytes, bytes]], body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": list(headers)})
    await send({"type": "http.response.body", "body": body, "more_body": False})
