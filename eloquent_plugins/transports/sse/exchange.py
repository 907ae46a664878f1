"""One request through the middleware: pass-through, a refused stream, or the producer side of a new stream.

The app's response start decides the mode: a ``200 text/event-stream`` becomes a stream (ids, replay store,
keep-alives, a connection that writes it to the client), unless its caller is over ``max_streams_per_client``;
anything else passes through byte for byte."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from eloquent_plugins.core.continuation import MAX_RECORD_BYTES
from eloquent_plugins.core.hooks.manager import StreamHooks
from eloquent_plugins.core.hooks.specs import StreamInfo
from eloquent_plugins.core.padding import response_padding
from eloquent_plugins.transports.asgi import HOOKS_EXTENSION, Message, Receive, Scope, Send, paced_by_server
from eloquent_plugins.transports.metrics import transport_label
from eloquent_plugins.transports.resume.base import StreamMeta
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.sse.connection import MAX_LAG_EVENTS, Connection, ConnState
from eloquent_plugins.transports.sse.headers import is_event_stream, json_error, respond, stream_headers
from eloquent_plugins.transports.sse.ids import identity_hash, new_stream_id, new_token
from eloquent_plugins.transports.sse.limits import Slot
from eloquent_plugins.transports.sse.mode import Mode
from eloquent_plugins.transports.sse.producer import Producer
from eloquent_plugins.transports.sse.receive import ReceiveRelay
from eloquent_plugins.transports.sse.socket_control import socket_control
from eloquent_plugins.transports.telemetry import StreamSpan

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from eloquent_plugins.transports.sse.host import StreamHost

log = logging.getLogger("eloquent_plugins.transports.sse")

_PRIVATE_LOG_EVENTS = 4 * MAX_LAG_EVENTS
STORE_DOUBT = 60.0
"""Seconds the producer keeps generating while the store cannot say whether anyone reads the stream elsewhere
(a reader on another replica holds its lease there); past it, a stream nobody reads here is abandoned."""


_SSE, _PASS = Mode.SSE, Mode.PASS  # ``app_send`` runs per event: a global read, not an Enum attribute lookup


class Exchange:
    __slots__ = ("mw", "scope", "send", "relay", "mode", "started", "log", "producer", "conn", "write", "token",
                 "hooks", "info", "abandon", "span", "slot", "local_readers", "seen_at", "cut_at", "watched_until")

    def __init__(self, mw: StreamHost, scope: Scope, receive: Receive, send: Send) -> None:
        self.mw = mw
        self.scope = scope
        self.send = send
        self.relay = ReceiveRelay(receive)
        self.relay.body_head = bytearray() if mw.padding is not None else None
        if mw.config.migrate and getattr(mw.store, "records_requests", False) and scope.get("method") == "POST":
            self.relay.record(MAX_RECORD_BYTES)  # what another replica needs to continue the stream
        self.mode = Mode.UNDECIDED
        self.started = time.monotonic()
        self.log: StreamLog | None = None
        self.producer: Producer | None = None
        self.conn: Connection | None = None
        self.write: Callable[[bytes], Awaitable[None]] | None = None
        """The stream's ``EventPath.write`` once its connection is up: where the app's body chunks go."""
        self.token: str | None = None
        self.hooks: StreamHooks | None = None
        self.info: StreamInfo | None = None
        self.abandon: asyncio.Task[None] | None = None
        self.span: Any = None
        self.slot: Slot | None = None
        """What this stream counts against ``max_streams_per_client``, until released."""
        self.local_readers = 0
        """Resume connections reading this stream in this process (they count as readers without the store)."""
        self.seen_at = 0.0
        """When (Unix time) its owner last asked for or stopped reading this stream here (``reader_seen``)."""
        self.cut_at = 0.0
        """When (Unix time) this middleware cut the stream's client (send timeout, queue bound, memory budget)."""
        self.watched_until = 0.0
        """The latest lease end the store reported while the client was away (a reader on another replica)."""

    async def run(self) -> None:
        try:
            await self.mw.app(self.scope, self.relay.receive, self.app_send)
        except Exception as exc:
            if self.mode is Mode.REFUSED or self.mode is Mode.HANDED_OVER:  # the app was told its client left
                log.debug("%s stream: the app ended with %r", self.mode.value, exc)
                return
            if self.mode is not Mode.SSE or self.producer is None or self.producer.log.closed:
                raise
            assert self.info is not None
            log.error("stream=%s engine failed after the response started: %r", self.info.stream_id, exc,
                      exc_info=exc)
            self.producer.fail(exc)
        finally:
            self.relay.close()
            try:
                if self.mode is Mode.SSE or self.mode is Mode.HANDED_OVER:
                    await self._finish()
            finally:
                self._release_slot()
                self.relay.forget()

    def app_send(self, message: Message) -> Awaitable[None]:
        """The app's ``send``. A plain function, because it runs per event: a streamed body chunk gets the event
        path's ``write`` coroutine back (the only coroutine of ours per event), a pass-through message the
        server's own ``send``; the rest is ``_app_send``."""
        write = self.write
        if write is not None:
            if message["type"] == "http.response.body" and message.get("more_body", False):
                body = message.get("body", b"")
                if body:
                    return write(body)
        elif self.mode is _PASS:
            return self.send(message)
        return self._app_send(message)

    async def _app_send(self, message: Message) -> None:
        mode = self.mode
        if mode is _SSE:
            if message["type"] == "http.response.body":
                producer = self.producer
                assert producer is not None
                body = message.get("body", b"")
                if body:
                    producer.feed(body)
                if not message.get("more_body", False):
                    producer.close("complete")
            return
        if mode is Mode.REFUSED or mode is Mode.HANDED_OVER:
            return  # the refusal went out, or the stream was handed over; the app is being told the client left
        if (message["type"] == "http.response.start" and message.get("status", 200) == 200
                and is_event_stream(message.get("headers", ()))):
            self.slot = self.mw.limits.acquire(self.scope)
            if self.slot is None:
                self.mode = Mode.REFUSED
                await self._refuse()
                return
            if not self.mw.budget.admit():
                self.mode = Mode.REFUSED
                await self._refuse_over_budget()
                return
            self.mode = Mode.SSE
            await self._start(message)
        else:
            self.mode = Mode.PASS
            await self.send(message)

    async def _start(self, message: Message) -> None:
        mw, scope = self.mw, self.scope
        store, metrics = mw.store, mw.metrics
        path = scope.get("path", "")
        codec = mw.codec_for(path)
        stream_id = new_stream_id()
        transport = transport_label(scope)
        hosted = (scope.get("extensions") or {}).get(HOOKS_EXTENSION)
        if isinstance(hosted, dict):  # the server would fire the hooks too (HTTP/3 front end): they are ours
            hosted["claimed"] = True
        label = hosted.get("transport", "sse") if isinstance(hosted, dict) else "sse"
        self.info = StreamInfo(stream_id, route=path, transport=label, codec=codec.name)
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
            recorded = self.relay.recorded  # what another replica needs to continue the stream
            try:
                await store.create(token, meta, stream_log, None if recorded is None else bytes(recorded))
            except Exception as exc:  # one line, not a traceback per request (the store was checked at start)
                log.warning("stream=%s resume store unavailable (%s): this stream is not resumable", stream_id,
                            exc.__class__.__name__ + (f": {exc}" if str(exc) else ""))
                token = None
        if token is None:
            store = None
            stream_log = StreamLog(max_events=_PRIVATE_LOG_EVENTS, max_bytes=64 << 20)
            headers = stream_headers(message.get("headers", ()), token=None)
            meta = StreamMeta(stream_id, "", 200, tuple(headers), path, codec.name, time.time())
        assert stream_log is not None and meta is not None
        self.token, self.log = token, stream_log
        mw.budget.add_stream(stream_log, resumable=token is not None,
                             abandon=self._shed if token is not None else None)
        if token is not None:
            mw.exchanges[token] = self
        self.producer = Producer(stream_log, token=token, hooks=self.hooks, codec=codec, metrics=metrics,
                                 started=self.started, transport=transport)
        metrics.start(transport)
        metrics.active_streams += 1
        metrics.active_connections += 1
        log.info("stream=%s started: %s %s (transport: %s, resumable: %s)", stream_id, scope.get("method"), path,
                 transport, token is not None)
        self.span = StreamSpan.start(mw.tracer, stream_id=stream_id, transport=transport, route=path,
                                     codec=codec.name, resumable=token is not None)
        if token is not None and self.span.span is not None:
            mw.spans[token] = self.span
        self.hooks.start()
        await self.send({"type": "http.response.start", "status": 200, "headers": headers})
        self.conn = Connection(self.send, LocalSource(meta, stream_log), 0, policy=mw.policy,
                               send_timeout=mw.config.send_timeout, metrics=metrics, merge=mw.merge_for(codec),
                               coalesce=mw.config.coalesce, max_queued=mw.config.max_queued_bytes,
                               socket=socket_control(scope),
                               padding=response_padding(mw.padding, codec.name, label, self.relay.body_head),
                               send_tick=0.0 if paced_by_server(scope) else mw.config.send_tick)
        self.producer.path.attach(self.conn, self.producer.feed)
        self.write = self.producer.path.write
        mw.budget.add_reader(stream_log, self.conn)
        task = self.conn.start()
        task.add_done_callback(self._connection_done)
        mw.drain.track(self, self.hand_over)
        if store is not None:
            self.relay.hold()
        self.relay.on_gone(self._client_gone)
        self.relay.watch()

    def _release_slot(self) -> None:
        """Idempotent: the stream ended, or its client left (a resume is not counted again)."""
        if self.slot is not None:
            self.slot.release()

    async def _refuse(self) -> None:
        mw, scope = self.mw, self.scope
        mw.metrics.streams_refused += 1
        log.info("stream refused: %s %s: the caller already holds %d live streams", scope.get("method"),
                 scope.get("path"), mw.limits.max_streams)
        self.relay.disconnect()  # the app sees its client gone and stops generating
        await respond(self.send, *mw.limits.refusal(mw.router, scope.get("path", "")))

    async def _refuse_over_budget(self) -> None:
        mw, scope = self.mw, self.scope
        self._release_slot()
        log.warning("stream refused: %s %s: the stream logs hold the memory budget (%d bytes)", scope.get("method"),
                    scope.get("path"), mw.budget.limit)
        self.relay.disconnect()  # the app sees its client gone and stops generating
        status, headers, body = json_error(
            mw.router, scope.get("path", ""), 503, "the server holds as many streamed bytes as it may (memory "
            "budget); retry shortly", "server_overloaded", type_="server_overloaded")
        await respond(self.send, status, [*headers, (b"retry-after", mw.budget.retry_after.encode())], body)

    def reader_seen(self, delta: int = 0) -> None:
        """Its owner asked to resume it here (``delta`` 0), a resume connection here started (+1) or ended (-1):
        the stream is not abandoned, whatever the store can say."""
        self.local_readers += delta
        self.seen_at = time.time()

    async def hand_over(self) -> None:
        """The drain's deadline came with this stream running: cut the client (it resumes elsewhere), tell the
        store its producer is gone after copying every event the log holds (a resume on another replica sees it
        at once), then stop the engine request. In that order: the store holds every event the client got, and
        the stream's log is not closed (which would write an end) before the store let go of it."""
        store, stream_log, token, info = self.mw.store, self.log, self.token, self.info
        if self.mode is Mode.SSE:
            # Nothing more is logged (nor by ``app_send``'s direct way): a resume here would get what Redis lacks
            self.mode, self.write = Mode.HANDED_OVER, None
        if self.conn is not None:
            self.conn.drained()
        if store is not None and token is not None and stream_log is not None and not stream_log.closed:
            try:
                await store.hand_over(token)
            except Exception as exc:  # noqa: BLE001 - the heartbeat then lapses as after a crash
                log.warning("stream=%s hand-over to the store failed (%r)", info.stream_id if info else "?", exc)
        if info is not None:
            log.warning("stream=%s ended by drain: handed over at the deadline after %d events (resumable: %s)",
                        info.stream_id, stream_log.next_index if stream_log is not None else 0, token is not None)
        self.relay.release()  # the app sees its client gone: the engine request stops (this server exits)

    def _connection_done(self, task: asyncio.Task[str]) -> None:
        conn = self.conn
        if conn is not None and conn.cut:
            assert self.info is not None
            self.cut_at = time.time()
            if conn.state is ConnState.DRAINED:
                pass  # said by ``hand_over``
            elif conn.timed_out:
                log.info("stream=%s client accepted no bytes for %.0fs: connection cut", self.info.stream_id,
                         self.mw.config.send_timeout)
            else:
                log.info("stream=%s client does not read (more than %d bytes queued): connection cut",
                         self.info.stream_id, conn.max_queued)
            self.relay.disconnect()
            if self.log is not None and conn.state is not ConnState.DRAINED:
                self.mw.budget.client_cut(self.log)  # while memory is tight, its stream is given up at once

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
        failing_since: float | None = None
        while not stream_log.closed:
            if grace > 0 or failing_since is not None:
                await asyncio.sleep(step if grace > 0 else 0.25)
            asked_at = time.time()  # the answer shows the leases as of this moment or later
            if self.local_readers > 0:
                continue  # read here right now (resumed on this replica)
            try:
                last = await mw.store.last_watched(token)
            except Exception as exc:
                # The store cannot say whether a reader elsewhere holds a lease: not an absence. Keep generating
                # (a resume here is seen without the store) for STORE_DOUBT seconds.
                if failing_since is None:
                    failing_since = asked_at
                    log.warning("stream=%s cannot read resume leases (%r): not aborting while the store is down",
                                self.info.stream_id, exc)
                if asked_at - failing_since < STORE_DOUBT:
                    continue
                last = None
            else:
                failing_since = None
                self.watched_until = last or 0.0
            if stream_log.closed:
                return
            if asked_at >= max(left_at, self.seen_at, last or 0.0) + grace:
                log.info("stream=%s abandoned: no reader for %.1fs, aborting the engine request",
                         self.info.stream_id, grace)
                self.relay.release()
                return

    def _shed(self) -> bool:
        """The memory budget drops this stream (``StreamBudget`` step 3): if its client was cut by us and has not
        resumed since (here, or on another replica as far as the store said at the last look), abort the engine
        request now and return True; the budget then discards the log, so a resume gets 410, never a gap. False
        (keep it) otherwise: a client that left on its own, or is reading again."""
        conn, stream_log = self.conn, self.log
        if (conn is None or not conn.cut or stream_log is None or stream_log.closed or self.local_readers > 0
                or self.seen_at > self.cut_at or self.watched_until > time.time()):
            return False
        assert self.info is not None
        log.info("stream=%s memory budget: its client was cut and has not resumed; dropping its %d held bytes and "
                 "aborting the engine request", self.info.stream_id, stream_log.nbytes)
        self.relay.disconnect()  # no-op when the cut was already seen
        if self.abandon is not None:
            self.abandon.cancel()
        self.relay.release()  # the app sees its client gone: the engine request is aborted
        return True

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
        try:
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
            if reason == "disconnected" and self.mode is not Mode.HANDED_OVER and not mw.budget.reading(producer.log):
                # Aborted: a resume gets 410 stream_aborted, never these events; keep the answer, not the bytes.
                # Not a stream the drain handed over: its mirror may still be copying them (the store's
                # ``hand_over``), and what it has not copied would be lost to the replica that continues it.
                producer.log.discard_before(producer.log.next_index)
            if mw.store is not None and self.token is not None:
                with contextlib.suppress(Exception):
                    await mw.store.finish(self.token)
        finally:
            self.write = None
            producer.path.detach()
            mw.drain.untrack(self)
            if self.token is not None:
                mw.exchanges.pop(self.token, None)
            mw.budget.remove_stream(producer.log)  # a finished log is the store's to count from here on
        self.hooks.end(reason)
        log.info("stream=%s ended: %s after %d events (first connection: %s)", self.info.stream_id, reason,
                 producer.events, conn_reason)
        if self.span is not None:
            self.span.end(reason, **producer.figures())
            if self.token is not None:
                mw.spans.pop(self.token, None)
