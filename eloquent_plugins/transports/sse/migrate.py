"""Migration: a resume that finds its stream's producer gone continues the generation on this replica.

The producing replica records the request with the stream (``RedisStore.create``); its events are in Redis.
When a resume here reads every event Redis holds and the producer's heartbeat has expired (SIGKILL, OOM, a drain
that ran out of time), ``MigratingSource`` takes the stream over instead of ending the body uncompleted: one
replica wins ``RedisStore.claim``, reads the request and the events back, asks ``core.continuation`` for the
continuation request, sends it to its own app (the built-in engine, the gateway in front of its vLLM, vLLM
itself with the plugin) and appends the spliced events to a new local log whose first index is the next event
id, mirrored to the same Redis stream. Readers anywhere, this one included, read on as if nothing happened.
Where the stream cannot be continued (``--migrate off``, no record, an answer the rules refuse, too many
migrations) it ends as before: uncompleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from eloquent_plugins.core.continuation import (MAX_MIGRATIONS, CannotContinue, Continuation, Emitted, Splice,
                                                plan, read_emitted)
from eloquent_plugins.core.hooks.manager import StreamHooks
from eloquent_plugins.core.hooks.specs import StreamInfo
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.core.sse_writer import format_event
from eloquent_plugins.transports.asgi import Message, Scope
from eloquent_plugins.transports.resume.base import ReplaySource, StreamMeta
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.sse.ids import new_token
from eloquent_plugins.transports.sse.producer import Producer
from eloquent_plugins.transports.telemetry import migration_event

if TYPE_CHECKING:
    from eloquent_plugins.transports.sse.host import MigrationHost

log = logging.getLogger("eloquent_plugins.transports.sse")

_DROP_HEADERS = frozenset({b"last-event-id", b"content-length", b"content-type", b"accept-encoding"})
MAX_ERROR_BODY = 64 << 10
ELSEWHERE = "elsewhere"
"""What a takeover returns when another replica won the stream: this reader reads on from Redis."""


def payloads_of(frames: list[bytes]) -> list[bytes]:
    """The data of each stored event frame (``id: ...\\ndata: ...\\n\\n``)."""
    parser = SSEParser()
    return [message.data.encode() for frame in frames for message in parser.feed(frame)]


def sub_request(scope: Scope, cont: Continuation) -> Scope:
    """The continuation as a request to this replica's app, with the resuming caller's own headers (it passed
    the owner check), never a stored credential."""
    body = cont.encoded()
    headers = [(k, v) for k, v in scope.get("headers", ()) if k.lower() not in _DROP_HEADERS]
    headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    # ``app`` and ``state`` stay: a host such as vLLM set them before this middleware and its routes read them.
    out = {k: v for k, v in scope.items() if k not in ("extensions", "router", "endpoint", "route", "path_params")}
    out.update(method="POST", path=cont.route, raw_path=cont.route.encode(), query_string=b"", headers=headers)
    return out


class MigratingSource:
    """A Redis-backed ``ReplaySource`` that, when its producer is found gone, calls ``takeover`` once; reading goes
    on from what it returns (a local log here, the same source when another replica took over), or the body ends
    uncompleted as before (None)."""

    def __init__(self, inner: Any, takeover: Callable[[int], Awaitable[ReplaySource | str | None]]) -> None:
        self.meta: StreamMeta = inner.meta
        self._inner = inner
        self._current: Any = inner
        self._takeover = takeover

    @property
    def end_reason(self) -> str | None:
        return self._current.end_reason  # type: ignore[no-any-return]

    def _pending(self) -> bool:
        return self._current is self._inner and bool(self._inner.producer_lost)

    async def check(self, cursor: int) -> None:
        await self._current.check(cursor)

    def take(self, cursor: int) -> list[bytes]:
        return self._current.take(cursor)  # type: ignore[no-any-return]

    def ended(self, cursor: int) -> bool:
        return not self._pending() and self._current.ended(cursor)  # type: ignore[no-any-return]

    async def wait(self, cursor: int, timeout: float, wake: asyncio.Future[None]) -> None:
        if not self._pending():
            await self._current.wait(cursor, timeout, wake)
            return
        new = await self._takeover(cursor)
        if new == ELSEWHERE:
            self._inner.resume_reading()  # another replica continues it: read its events from Redis
        elif isinstance(new, LocalSource):
            self._inner.close()
            self._current = new
        else:
            self._inner.producer_lost = False  # ends uncompleted, as without migration

    def close(self) -> None:
        self._current.close()


class Migration:
    """One takeover attempt of the stream ``token`` at event ``cursor``, by the resume whose request is ``scope``."""

    def __init__(self, mw: MigrationHost, scope: Scope, token: str, meta: StreamMeta) -> None:
        self.mw, self.scope, self.token, self.meta = mw, scope, token, meta
        self.span: Any = None
        """The span the migration is recorded on (the resume's own), set by the resume."""
        self.consumer = new_token()[:12]
        self.task: asyncio.Task[None] | None = None

    async def __call__(self, cursor: int) -> ReplaySource | str | None:
        mw, store, meta = self.mw, self.mw.store, self.meta
        claim = getattr(store, "claim", None)
        if claim is None:
            return None
        if mw.drain.draining:
            # This replica is going away: a continuation here would be cut again at its exit. The body ends
            # here as a cut does, nothing claimed or written, so the client's next resume (another replica, as
            # the balancer no longer sends new work here) continues it.
            log.info("stream=%s producer gone at event %d: left to another replica (this one drains)",
                     meta.stream_id, cursor)
            return None
        try:
            outcome = await claim(self.token, self.consumer, MAX_MIGRATIONS)
            if outcome == "taken":
                mw.metrics.migration("elsewhere")
                log.info("stream=%s producer gone at event %d: another replica continues it", meta.stream_id, cursor)
                return ELSEWHERE
            if outcome != "won":
                raise CannotContinue(f"migrated {MAX_MIGRATIONS} times already")
            request, entries = await store.migration_record(self.token)  # type: ignore[union-attr]
            if request is None:
                raise CannotContinue("no request was recorded (too large, or migration off where it started)")
            if [index for index, _ in entries] != list(range(len(entries))) or len(entries) != cursor:
                raise CannotContinue(f"Redis holds events {entries[0][0] if entries else 0}..{len(entries)} and "
                                     f"the reader is at {cursor}")
            emitted = read_emitted(meta.codec, payloads_of([frame for _, frame in entries]))
            cont = plan(meta.route, meta.codec, json.loads(request), emitted,
                        token_ids=emitted.prompt_token_ids is not None)
        except (CannotContinue, ValueError) as exc:
            await self._give_up(cursor, str(exc))
            return None
        except Exception as exc:  # noqa: BLE001 - the store failed: end as without migration
            await self._give_up(cursor, f"resume store: {exc!r}")
            return None
        return await self._start(cursor, cont, emitted)

    async def _give_up(self, cursor: int, why: str) -> None:
        self.mw.metrics.migration("refused")
        log.warning("stream=%s producer gone at event %d, not migrated (%s): the stream ends uncompleted",
                    self.meta.stream_id, cursor, why)
        migration_event(self.span, at=cursor, outcome="refused", engine=self.meta.codec, reason=why)
        with contextlib.suppress(Exception):
            release = getattr(self.mw.store, "release_claim", None)
            if release is not None:
                await release(self.token, self.consumer)

    async def _start(self, cursor: int, cont: Continuation, emitted: Emitted) -> ReplaySource:
        mw, meta, store = self.mw, self.meta, self.mw.store
        stream_log = StreamLog(max_events=getattr(store, "max_stream_events", 100_000))
        stream_log.start_at(cursor)
        await store.adopt(self.token, meta, stream_log)  # type: ignore[union-attr]
        info = StreamInfo(meta.stream_id, route=meta.route, transport="sse", codec=meta.codec)
        codec = mw.codecs.get(meta.codec, mw.codecs["openai"])
        producer = Producer(stream_log, token=self.token, hooks=StreamHooks(mw.pm, info), codec=codec,
                            metrics=mw.metrics, started=time.monotonic())
        mw.metrics.migration("migrated")
        log.info("stream=%s producer gone at event %d: migrated here (%d tokens emitted, continuing with %s %s, "
                 "max %s)", meta.stream_id, cursor, emitted.tokens, cont.source, cont.route,
                 cont.body.get("max_tokens", cont.body.get("max_completion_tokens", "-")))
        migration_event(self.span, at=cursor, outcome="migrated", engine=cont.source)
        source = LocalSource(meta, stream_log)
        self.task = asyncio.get_running_loop().create_task(self._run(cont, Splice(cont, emitted), producer),
                                                           name=f"eloquent-migration-{meta.stream_id}")
        return source

    async def _run(self, cont: Continuation, splice: Splice, producer: Producer) -> None:
        mw, meta = self.mw, self.meta
        stop = asyncio.Event()
        sent = False
        parser = SSEParser()
        status = 0
        rejected = bytearray()
        handed = False

        async def receive() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": cont.encoded(), "more_body": False}
            await stop.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            nonlocal status
            if handed:
                return  # handed over: an event logged now would reach a reader here, never Redis
            if message["type"] == "http.response.start":
                status = int(message.get("status", 200))
            elif message["type"] == "http.response.body":
                body = message.get("body", b"")
                if status != 200:
                    if len(rejected) < MAX_ERROR_BODY:
                        rejected.extend(body[:MAX_ERROR_BODY])
                    return
                for event in parser.feed(body):
                    for payload in splice.payloads(event.data.encode()):
                        producer.feed(format_event(payload))

        async def hand_over() -> None:
            """The drain's deadline came with this continuation running: as for a stream produced here
            (``Exchange.hand_over``), the store lets go first (every event copied, no end written), then the
            engine request stops; the client resumes on another replica, which continues it again."""
            nonlocal handed
            handed = True
            try:
                await mw.store.hand_over(self.token)  # type: ignore[union-attr]
            except Exception as exc:  # noqa: BLE001 - the heartbeat then lapses as after a crash
                log.warning("stream=%s hand-over to the store failed (%r)", meta.stream_id, exc)
            log.warning("stream=%s ended by drain: migrated stream handed over at the deadline after %d events",
                        meta.stream_id, producer.log.next_index)
            stop.set()

        mw.drain.track(self, hand_over)
        watcher = asyncio.get_running_loop().create_task(self._watch_abandon(producer.log, stop))
        try:
            await mw.app(sub_request(self.scope, cont), receive, send)
            if handed:
                pass  # not an end: another replica continues it
            elif status != 200:
                producer.fail(RuntimeError(f"the continuation was refused: HTTP {status}: "
                                           f"{bytes(rejected).decode('utf-8', 'replace')[:500]}"))
            elif not splice.finished:
                producer.fail(RuntimeError("the continuation ended before the answer finished"))
            else:
                producer.close("complete")
        except Exception as exc:  # noqa: BLE001 - an in-band error, as for any engine failure after the 200
            log.error("stream=%s continuation failed: %r", meta.stream_id, exc)
            producer.fail(exc)
        finally:
            mw.drain.untrack(self)
            watcher.cancel()
            if not producer.log.closed:
                producer.close("disconnected")
            log.info("stream=%s ended: %s after %d events (migrated)", meta.stream_id, producer.log.reason,
                     producer.log.next_index)
            with contextlib.suppress(Exception):
                await mw.store.finish(self.token)  # type: ignore[union-attr]

    async def _watch_abandon(self, stream_log: StreamLog, stop: asyncio.Event) -> None:
        """Abort the continuation once nobody has read the stream (here or elsewhere) for ``resume_grace``."""
        mw = self.mw
        grace = max(mw.config.resume_grace, 1.0)
        while not stream_log.closed:
            await asyncio.sleep(grace / 4)
            if len(stream_log.listeners) > 1:  # a local reader besides the mirror
                continue
            with contextlib.suppress(Exception):
                last = await mw.store.last_watched(self.token)  # type: ignore[union-attr]
                if time.time() >= (last or 0.0) + grace:
                    log.info("stream=%s abandoned after migration: no reader for %.1fs", self.meta.stream_id, grace)
                    stop.set()
                    return
