"""The resume endpoint: a request with ``Last-Event-ID`` (or ``?last_event_id=``) gets the events after that id,
then the live tail, from the replay store, without a second engine request.

Checks, in order: the id parses, the store knows the token, the caller owns the stream, the events after the id
are still kept, the stream was not aborted, and it is not over. Each failure is a plain JSON error in the route's
shape (``400`` ``404`` ``403`` ``410`` ``503``) and ``204`` for a stream that is over, which tells a browser
EventSource to stop reconnecting. Whatever store call fails (open, check, the first lease), the answer is ``503
resume_store_unavailable`` with ``Retry-After``, and a stream produced here is told its owner asked for it, so the
failure never makes it look abandoned.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from eloquent_plugins.core.protocol import BadEventId, ResumePoint, parse_event_id
from eloquent_plugins.transports.asgi import Receive, Scope, Send, paced_by_server
from eloquent_plugins.transports.metrics import transport_label
from eloquent_plugins.transports.resume.base import ReplaySource, ResumeStore
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.transports.resume.log import EventsGone
from eloquent_plugins.transports.sse.connection import Connection
from eloquent_plugins.transports.sse.headers import json_error, respond
from eloquent_plugins.transports.sse.ids import identity_hash, new_token
from eloquent_plugins.transports.sse.migrate import MigratingSource, Migration
from eloquent_plugins.transports.sse.socket_control import socket_control
from eloquent_plugins.transports.telemetry import resume_span

if TYPE_CHECKING:
    from eloquent_plugins.transports.sse.host import ResumeHost

log = logging.getLogger("eloquent_plugins.transports.sse")

_Refusal = tuple[int, str, str, str]
"""(status, message, code, error type) of a resume that cannot be served."""
_STORE_DOWN: _Refusal = (503, "the resume store is unavailable; retry shortly", "resume_store_unavailable",
                         "server_error")
_FINISHED: _Refusal = (204, "", "", "")
_ABORTED: _Refusal = (410, "this stream was aborted (its client left and nobody resumed it in time, or the server "
                      "gave it up under memory pressure after cutting a client that did not read); send the request "
                      "again", "stream_aborted", "invalid_request_error")
STORE_RETRY_AFTER = b"1"
"""``Retry-After`` of a 503 ``resume_store_unavailable``: a store connection is retried per request."""


async def _refuse(mw: ResumeHost, send: Send, path: str, refusal: _Refusal) -> None:
    status, message, code, type_ = refusal
    if status == 204:
        await respond(send, 204, [], b"")
        return
    status, headers, body = json_error(mw.router, path, status, message, code, type_=type_)
    if status == 503:
        headers = [*headers, (b"retry-after", STORE_RETRY_AFTER)]
    await respond(send, status, headers, body)


async def serve_resume(mw: ResumeHost, scope: Scope, receive: Receive, send: Send, raw: str) -> None:
    """Answer one resume request whose raw id is ``raw``."""
    store, metrics = mw.store, mw.metrics
    assert store is not None
    path = scope.get("path", "")

    async def refuse(refusal: _Refusal) -> None:
        await _refuse(mw, send, path, refusal)

    try:
        point = parse_event_id(raw)
    except BadEventId as exc:
        metrics.resume("bad_id")
        await refuse((400, str(exc), "invalid_last_event_id", "invalid_request_error"))
        return
    try:
        source = await store.open(point.token)
    except Exception as exc:  # one line per request, not a traceback (the store was checked at start)
        log.warning("resume refused (503): resume store unavailable (%s)", _why(exc))
        metrics.resume("store_error")
        await refuse(_STORE_DOWN)
        return
    if source is None:
        metrics.resume("not_found")
        await refuse((404, "unknown or expired stream: it cannot be resumed; send the request again without "
                      "Last-Event-ID", "stream_not_found", "invalid_request_error"))
        return
    try:
        refusal = await _check(mw, scope, source, point)
    except BaseException:
        source.close()
        raise
    if refusal is not None:
        source.close()
        await refuse(refusal)
        return
    migration: Migration | None = None
    if mw.config.migrate and getattr(source, "producer_lost", None) is not None:
        migration = Migration(mw, scope, point.token, source.meta)
        source = MigratingSource(source, migration)
    await _replay(mw, scope, receive, send, source, point, migration)


async def _check(mw: ResumeHost, scope: Scope, source: ReplaySource, point: ResumePoint) -> _Refusal | None:
    """Why this caller cannot read ``source`` after ``point`` (counted in the metrics), or None when it can."""
    metrics, meta, cursor = mw.metrics, source.meta, point.after + 1
    if not hmac.compare_digest(meta.owner, identity_hash(scope, mw.identity)):
        metrics.resume("forbidden")
        log.warning("stream=%s resume refused: caller differs from the one that started it", meta.stream_id)
        return 403, "this stream belongs to another caller", "stream_forbidden", "permission_error"
    try:
        await source.check(cursor)
    except EventsGone as exc:
        if source.end_reason == "disconnected":
            metrics.resume("aborted")  # an aborted stream's events are dropped with it
            return _ABORTED
        metrics.resume("expired")
        return 410, f"the events after {point.after} have expired ({exc})", "events_expired", "invalid_request_error"
    except ValueError as exc:
        metrics.resume("bad_id")
        return 400, str(exc), "invalid_last_event_id", "invalid_request_error"
    except Exception as exc:
        log.warning("stream=%s resume refused (503): resume store unavailable (%s)", meta.stream_id, _why(exc))
        metrics.resume("store_error")
        return _STORE_DOWN
    if source.end_reason == "disconnected":
        metrics.resume("aborted")
        return _ABORTED
    if source.ended(cursor) and not source.take(cursor):
        metrics.resume("finished")
        return _FINISHED
    return None


async def _replay(mw: ResumeHost, scope: Scope, receive: Receive, send: Send, source: ReplaySource,
                  point: ResumePoint, migration: Migration | None = None) -> None:
    """Serve the stream from the event after ``point`` to its end, on a connection holding a lease on it."""
    store, metrics, meta = mw.store, mw.metrics, source.meta
    assert store is not None
    consumer = new_token()[:12]
    producer = mw.exchanges.get(point.token)  # produced here: it sees this reader without the store
    if producer is not None:
        producer.reader_seen()
    try:
        await store.lease(point.token, consumer, mw.lease_ttl)
    except Exception as exc:
        source.close()
        log.warning("stream=%s resume refused (503): resume store unavailable, cannot lease (%s)", meta.stream_id,
                    _why(exc))
        metrics.resume("store_error")
        await _refuse(mw, send, scope.get("path", ""), _STORE_DOWN)
        return
    metrics.resume("ok")
    log.info("stream=%s resumed after event %d (connection %s)", meta.stream_id, point.after, consumer)
    span, transport = mw.spans.get(point.token), transport_label(scope)
    own_span: Any = None
    if span is not None:
        span.resumed(point.after, transport)
    else:
        own_span = resume_span(mw.tracer, stream_id=meta.stream_id, after=point.after, transport=transport)
    if migration is not None:
        migration.span = own_span if own_span is not None else getattr(span, "span", None)
    conn = Connection(send, source, point.after + 1, policy=mw.policy, send_timeout=mw.config.send_timeout,
                      metrics=metrics, merge=mw.merge_for(mw.codecs.get(meta.codec, mw.codecs["openai"])),
                      coalesce=mw.config.coalesce,
                      renew_lease=lambda: _renew(store, point.token, consumer, mw.lease_ttl),
                      lease_every=mw.lease_ttl / 3, max_queued=mw.config.max_queued_bytes,
                      socket=socket_control(scope), padding=mw.padding,
                      send_tick=0.0 if paced_by_server(scope) else mw.config.send_tick)
    local_log = source.log if isinstance(source, LocalSource) else None
    if local_log is not None:
        mw.budget.add_reader(local_log, conn)
    if producer is not None:
        producer.reader_seen(+1)
    metrics.active_connections += 1
    reason = "error"
    try:
        await send({"type": "http.response.start", "status": 200, "headers": list(meta.headers)})
        conn.start()
        mw.drain.track(conn, _drained(meta.stream_id, consumer, conn))
        watcher = asyncio.get_running_loop().create_task(_watch_disconnect(receive, conn))
        try:
            reason = await conn.finished()
        finally:
            watcher.cancel()
    finally:
        mw.drain.untrack(conn)
        metrics.active_connections -= 1
        if local_log is not None:
            mw.budget.remove_reader(local_log, conn)
        if producer is not None:
            producer.reader_seen(-1)
        with contextlib.suppress(Exception):
            await store.release(point.token, consumer)
        log.info("stream=%s connection %s ended: %s at event %d", meta.stream_id, consumer, reason,
                 conn.cursor - 1)
        if own_span is not None:
            own_span.end()


def _drained(stream_id: str, consumer: str, conn: Connection) -> Callable[[], Awaitable[None]]:
    """What the drain's deadline does to a resume connection here: cut it (its client resumes elsewhere)."""
    async def hand_over() -> None:
        log.warning("stream=%s ended by drain: resume connection %s cut at the deadline at event %d", stream_id,
                    consumer, conn.cursor - 1)
        conn.drained()

    return hand_over


def _why(exc: BaseException) -> str:
    """An exception in one line: its type and message."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


async def _renew(store: ResumeStore, token: str, consumer: str, ttl: float) -> None:
    """A lease renewal; a failure is logged, not raised (a reader here is seen by its producer anyway)."""
    try:
        await store.lease(token, consumer, ttl)
    except Exception as exc:  # noqa: BLE001 - the connection goes on; the next tick tries again
        log.debug("renewing the lease on a resumed stream failed: %r", exc)


async def _watch_disconnect(receive: Receive, conn: Connection) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    conn.disconnect()
