"""Redis Streams store: several replicas behind a load balancer share resumable streams.

Layout: ``redis_layout`` (the meta JSON, a Redis stream per stream whose entry ``<index>-1`` holds event
``index``'s frame and whose last entry marks the end, the heartbeat, the recorded request, reader leases). The
producing replica serves its own readers from memory and mirrors the log to Redis in pipelined batches (one round trip per
batch, not per event); other replicas read with ``XREAD BLOCK``. Keys expire ``resume_ttl`` seconds after the
stream ends (refreshed while it is live), and each stream keeps at most ``max_stream_events`` entries
(``XADD MAXLEN ~``).

Faults: a reader that falls behind the trim gets ``EventsGone`` (a 410) before its body starts and a cut body
after, never a jump; connection resets are retried with bounded backoff by the mirror (``redis_mirror``) and by
remote readers, which end cut (never complete-looking) when Redis stays unreachable.

URL: ``redis://host:port/db?prefix=eloquent&max_stream_events=100000`` (also ``rediss://``, ``unix://``; redis-py's
own URL options such as ``max_connections`` pass through; default 4096 connections, as each remote reader holds
one while it blocks in ``XREAD``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.resume.log import EventsGone, StreamLog
from eloquent_plugins.transports.resume.base import ReplaySource, ResumeStore, StreamMeta
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.transports.resume.redis_layout import (
    HEARTBEAT_TTL, MIRROR_RETRY_FOR, READ_BATCH, READ_RETRY_FOR, REPLY_TIMEOUT, RETRY_FIRST, RETRY_MAX,
    after_id, entry_index, live_ttl, redis_key, transient)
from eloquent_plugins.transports.resume.redis_mirror import Mirror

log = logging.getLogger("eloquent_plugins.transports.resume")

_OUR_OPTIONS = ("prefix", "max_stream_events", "heartbeat_ttl")
SENT_WAIT = 2.0
"""Seconds a resume of a live stream waits for the event it names to reach Redis before calling it never sent."""
__all__ = ["HEARTBEAT_TTL", "RedisSource", "RedisStore"]


class RedisSource:
    """A stream produced on another replica, read from Redis.

    Entries are absorbed strictly in order from ``_read_through``: a duplicate is skipped and a gap (entries
    trimmed by ``max_stream_events`` while this reader was paused) is never jumped over. Before the body starts a
    gap raises ``EventsGone`` (a 410); after it, and when Redis stays unreachable past ``read_retry_for``, the
    body is cut (``end_reason`` ``disconnected``, the reason in ``gone``) so the client can tell."""

    def __init__(self, store: RedisStore, token: str, meta: StreamMeta) -> None:
        self.meta = meta
        self._store = store
        self._key = store.key("s", token)
        self._heartbeat = store.key("h", token)
        self._buffer: list[bytes] = []
        """Fetched frames not yet taken, index ``_buffer_base`` on; at most one XREAD batch (``READ_BATCH``)."""
        self._buffer_base = 0
        self._end: int | None = None
        self.end_reason: str | None = None
        self.gone: str | None = None
        """Why this body was cut short (events trimmed while it was read, Redis unreachable), once it was."""
        self.producer_lost = False
        """The producer's heartbeat expired with every event it copied read: the stream may be continued here
        (``transports.sse.migrate``) instead of ending uncompleted."""
        self._read_through = 0
        """Entries with index < this have been fetched."""
        self._failing_since: float | None = None
        self._delay = 0.0

    def _frames_through(self) -> int:
        """The index after the last frame fetched (the end marker is no frame)."""
        return self._end if self._end is not None else self._read_through

    def _absorb(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        """Append entries that continue ``_read_through``; raise EventsGone at a gap instead of rebasing past it."""
        for entry_id, fields in entries:
            if self._end is not None:
                return
            index = entry_index(entry_id)
            if index < self._read_through:
                continue
            if index > self._read_through:
                raise EventsGone(f"events {self._read_through} to {index - 1} are no longer kept")
            if b"end" in fields:
                self._end = index
                self.end_reason = fields[b"end"].decode()
            else:
                if not self._buffer:
                    self._buffer_base = index
                self._buffer.append(fields[b"f"])
            self._read_through = index + 1

    def _cut(self, at: int, why: str) -> None:
        """End this body uncompleted at ``at`` (frames before it that are buffered still go out)."""
        if self.gone is None:
            log.warning("stream %s: resume cut at event %d: %s", self._key, at, why)
        self.gone = why
        del self._buffer[max(0, at - self._buffer_base):]
        self._end = at
        self._read_through = max(self._read_through, at)
        self.end_reason = "disconnected"

    async def check(self, cursor: int) -> None:
        entries = await self._store.redis.xrange(self._key, min=f"{cursor}-0", max="+", count=READ_BATCH)
        if entries:
            first = entry_index(entries[0][0])
            if first > cursor:
                raise EventsGone(f"events before {first} are no longer kept")
        else:
            last = await self._store.redis.xrevrange(self._key, max="+", min="-", count=1)
            if last and b"end" in last[0][1]:
                self.end_reason = last[0][1][b"end"].decode()
                if cursor > entry_index(last[0][0]):
                    raise ValueError(f"event {cursor - 1} was never sent on this stream")
            elif cursor > (entry_index(last[0][0]) + 1 if last else 0):
                await self._await_sent(cursor - 1)
        self._buffer.clear()
        self._buffer_base = self._read_through = cursor
        self._absorb(entries)

    async def _await_sent(self, index: int) -> None:
        """A live stream whose copy ends before event ``index``: the producer may be a batch behind in mirroring
        it, so wait ``SENT_WAIT`` s for it. Not there by then: the producer either never sent it, or died before
        copying what it sent (the client holds events Redis never got). Its heartbeat tells which: refreshed (every
        ``HEARTBEAT_TTL / 3`` s) means alive, so the index was never sent (``ValueError``, a 400); expired means the
        events past the copy are lost, so this body ends uncompleted at once (a cut, as for any resume of a stream
        whose producer died), never a false "never sent"."""
        if await self._arrives(index, SENT_WAIT):
            return
        redis = self._store.redis
        ttl = await asyncio.wait_for(redis.pttl(self._heartbeat), REPLY_TIMEOUT)
        deadline = time.monotonic() + self._store.heartbeat_ttl + REPLY_TIMEOUT
        while ttl >= 0 and time.monotonic() < deadline:  # -1 (no expiry) cannot lapse: taken as alive
            if await self._arrives(index, 1.0):
                return
            refreshed = await asyncio.wait_for(redis.pttl(self._heartbeat), REPLY_TIMEOUT)
            if refreshed > ttl + 500:  # the producer is alive
                break
            ttl = refreshed
        if ttl == -2:  # no heartbeat: the producer died with events it sent past its copy
            log.warning("stream %s: resume after event %d, which the producer sent but never copied before it "
                        "stopped: ending the resume uncompleted", self._key, index)
            self._end = index + 1
            self.end_reason = "disconnected"
            return
        raise ValueError(f"event {index} was never sent on this stream")

    async def _arrives(self, index: int, wait: float) -> bool:
        """Does event ``index`` reach the copy within ``wait`` seconds? ``ValueError`` if the stream's end marker
        comes first: it ended without that event."""
        block = max(1, int(wait * 1000))
        result = await asyncio.wait_for(self._store.redis.xread({self._key: after_id(index)}, count=1, block=block),
                                        wait + REPLY_TIMEOUT)
        for _key, entries in result or ():
            if entries:
                if b"end" in entries[0][1]:
                    raise ValueError(f"event {index} was never sent on this stream")
                return True
        return False

    def take(self, cursor: int) -> list[bytes]:
        """Buffered frames from ``cursor`` on; frames before ``cursor`` are dropped (the reader has them). A
        ``cursor`` before what is held (frames this reader never got are gone) cuts the body."""
        buffer = self._buffer
        through = self._frames_through()
        held_from = self._buffer_base if buffer else through
        if cursor < held_from:
            self._cut(cursor, f"events {cursor} to {held_from - 1} were dropped before this reader took them")
            return []
        if cursor >= through:
            buffer.clear()
            if self._end is None:
                self._read_through = cursor  # the reader already has everything before it
            return []
        if cursor > self._buffer_base:
            del buffer[:cursor - self._buffer_base]
            self._buffer_base = cursor
        return buffer[:]

    def ended(self, cursor: int) -> bool:
        return self._end is not None and cursor >= self._end

    async def wait(self, cursor: int, timeout: float, wake: asyncio.Future[None]) -> None:
        """Fetch what follows ``cursor``; never raises: a gap or a lasting Redis failure cuts the body, a
        transient one (a connection reset) is retried from the cursor with bounded exponential backoff."""
        if self._buffer or self._end is not None:
            return
        try:
            await self._fetch(cursor, timeout)
        except EventsGone as exc:
            self._cut(self._frames_through(), str(exc))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever Redis raised, the reader ends cleanly
            await self._failed(exc, timeout)
        else:
            self._failing_since = None

    async def _fetch(self, cursor: int, timeout: float) -> None:
        redis = self._store.redis
        block = max(1, int(min(timeout, 1.0) * 1000))
        guard = block / 1000 + REPLY_TIMEOUT
        result = await asyncio.wait_for(redis.xread(
            {self._key: after_id(max(cursor, self._read_through))}, count=READ_BATCH, block=block), guard)
        for _key, entries in result or ():
            self._absorb(entries)
        if result:
            return
        pipe = redis.pipeline(transaction=False)
        pipe.exists(self._key)
        pipe.exists(self._heartbeat)
        stream_exists, producer_alive = await asyncio.wait_for(pipe.execute(), REPLY_TIMEOUT)
        if not stream_exists:
            raise EventsGone("the stream expired while it was being read")
        if not producer_alive and self._end is None:
            # The producing replica stopped without writing an end: end this body uncompleted ("disconnected"),
            # so the client sees a cut stream rather than a silent one; a later resume gets the same answer.
            log.warning("stream %s: producer heartbeat lost at event %d", self._key, max(cursor, self._read_through))
            self._end = max(cursor, self._read_through)
            self.end_reason = "disconnected"
            self.producer_lost = cursor >= self._read_through

    def resume_reading(self) -> None:
        """Another replica took the stream over (``RedisStore.claim``): read on from where this body stands."""
        if self.producer_lost:
            self.producer_lost = False
            self._end, self.end_reason = None, None

    async def _failed(self, exc: Exception, timeout: float) -> None:
        store = self._store
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since, self._delay = now, store.retry_first
        if transient(exc) and now - self._failing_since < store.read_retry_for:
            log.debug("stream %s: reading from Redis failed (%r); retrying", self._key, exc)
            await asyncio.sleep(min(self._delay, max(0.0, timeout)))
            self._delay = min(self._delay * 2, store.retry_max)
            return
        self._cut(self._frames_through(), f"reading from Redis failed: {exc!r}")

    def close(self) -> None:
        return None


class RedisStore(ResumeStore):
    scheme = "redis"

    def __init__(self, url: str, *, ttl: float = 300.0) -> None:
        import redis.asyncio as aioredis  # optional dependency: eloquent-plugins[redis]

        parts = urlsplit(url)
        query = parse_qsl(parts.query)
        ours = {k: v for k, v in query if k in _OUR_OPTIONS}
        rest = [(k, v) for k, v in query if k not in _OUR_OPTIONS]
        self.prefix = ours.get("prefix", "eloquent")
        try:
            self.max_stream_events = int(ours.get("max_stream_events", "100000"))
            self.heartbeat_ttl = int(ours.get("heartbeat_ttl", str(HEARTBEAT_TTL)))
        except ValueError:
            raise ConfigError(f"max_stream_events and heartbeat_ttl must be integers in {url!r}") from None
        if self.heartbeat_ttl < 1:
            raise ConfigError(f"heartbeat_ttl must be at least 1 second in {url!r}")
        self.ttl = ttl
        self.url = urlunsplit(parts._replace(query=urlencode(rest)))
        # Each remote reader holds one connection while it blocks in XREAD: allow many (redis-py's URL option
        # ``max_connections`` overrides), and wait for a free one rather than fail.
        max_connections = 4096 if "max_connections" not in dict(rest) else None
        pool = aioredis.BlockingConnectionPool.from_url(self.url, timeout=30, **(
            {"max_connections": max_connections} if max_connections else {}))
        self.redis: Any = aioredis.Redis(connection_pool=pool, decode_responses=False)
        self._local: dict[str, tuple[StreamMeta, StreamLog, asyncio.Task[None]]] = {}
        self._mirrors: dict[str, Mirror] = {}
        """The mirror of each live stream produced here (``hand_over`` stops one)."""
        self._tasks: set[asyncio.Task[None]] = set()
        """Every running mirror, also those of finished streams still retrying (``aclose`` cancels them)."""
        self.retry_first, self.retry_max = RETRY_FIRST, RETRY_MAX
        self.mirror_retry_for = MIRROR_RETRY_FOR
        self.read_retry_for = READ_RETRY_FOR

    def key(self, kind: str, token: str) -> str:
        return redis_key(self.prefix, kind, token)

    def new_log(self) -> StreamLog:
        return StreamLog(max_events=self.max_stream_events)

    records_requests = True
    """``create`` takes the request to record (``transports.sse.migrate``)."""

    async def create(self, token: str, meta: StreamMeta, log_: StreamLog, request: bytes | None = None) -> None:
        """Publish; ``request``: the request body, kept with the stream so another replica can continue it."""
        keep = live_ttl(self.ttl)
        pipe = self.redis.pipeline(transaction=False)
        pipe.set(self.key("m", token), meta.to_json(), ex=keep)
        pipe.set(self.key("h", token), b"1", ex=self.heartbeat_ttl)
        if request is not None:
            pipe.set(self.key("q", token), request, ex=keep)
        await pipe.execute()
        self._mirror(token, meta, log_)

    def _mirror(self, token: str, meta: StreamMeta, log_: StreamLog) -> None:
        mirror = Mirror(self, token, log_)
        mirror.cursor = log_.base  # a continued stream's log starts where the copy in Redis ends
        task = asyncio.get_running_loop().create_task(mirror.run(), name=f"eloquent-mirror-{meta.stream_id}")
        self._tasks.add(task)
        self._mirrors[token] = mirror
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(lambda _: self._mirrors.pop(token, None))
        self._local[token] = (meta, log_, task)

    async def claim(self, token: str, consumer: str, max_migrations: int) -> str:
        """Take over a stream whose producer is gone: ``won`` for exactly one caller while its heartbeat is down
        (the heartbeat is up again at once, so readers elsewhere wait for the events this replica will copy
        instead of ending), ``taken`` for the others, ``exhausted`` past ``max_migrations`` per stream."""
        redis = self.redis
        won = await asyncio.wait_for(redis.set(self.key("h", token), consumer.encode(), ex=self.heartbeat_ttl,
                                               nx=True), REPLY_TIMEOUT)
        if not won:
            return "taken"
        pipe = redis.pipeline(transaction=False)
        pipe.incr(self.key("c", token))
        pipe.expire(self.key("c", token), live_ttl(self.ttl))
        count, _ = await asyncio.wait_for(pipe.execute(), REPLY_TIMEOUT)
        if count > max_migrations:
            await self.release_claim(token, consumer)
            return "exhausted"
        return "won"

    async def release_claim(self, token: str, consumer: str) -> None:
        """Give a claim up (the stream could not be continued): readers elsewhere then end uncompleted too."""
        key = self.key("h", token)
        if await self.redis.get(key) == consumer.encode():
            await self.redis.delete(key)

    async def migration_record(self, token: str) -> tuple[bytes | None, list[tuple[int, bytes]]]:
        """The recorded request and every event frame Redis holds, by index (for ``core.continuation``)."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.get(self.key("q", token))
        pipe.xrange(self.key("s", token), min="-", max="+", count=self.max_stream_events + 1)
        request, entries = await asyncio.wait_for(pipe.execute(), REPLY_TIMEOUT)
        return request, [(entry_index(i), f[b"f"]) for i, f in entries if b"f" in f]

    async def adopt(self, token: str, meta: StreamMeta, log_: StreamLog) -> None:
        """Produce a stream whose first ``log_.base`` events are in Redis already (a continuation)."""
        self._mirror(token, meta, log_)

    async def finish(self, token: str) -> None:
        entry = self._local.pop(token, None)
        if entry is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(entry[2]), 10.0)

    async def hand_over(self, token: str) -> None:
        """Let the mirror copy every event the log holds now, then drop the heartbeat without writing an end:
        remote readers (``RedisSource._fetch``, ``_await_sent``) see the producer gone within one read."""
        entry, mirror = self._local.get(token), self._mirrors.get(token)
        if entry is None or mirror is None:
            return
        mirror.hand_over()
        try:
            await asyncio.wait_for(asyncio.shield(entry[2]), REPLY_TIMEOUT)
        except Exception:  # noqa: BLE001 - gone the hard way: stop it and drop the heartbeat ourselves
            entry[2].cancel()
            await mirror._abandon()
        self._local.pop(token, None)

    async def open(self, token: str) -> ReplaySource | None:
        local = self._local.get(token)
        if local is not None:
            return LocalSource(local[0], local[1])
        raw = await self.redis.get(self.key("m", token))
        if raw is None:
            return None
        return RedisSource(self, token, StreamMeta.from_json(raw))

    async def lease(self, token: str, consumer: str, ttl: float) -> None:
        key = self.key("l", token)
        pipe = self.redis.pipeline(transaction=False)
        pipe.zadd(key, {consumer: time.time() + ttl})
        pipe.expire(key, live_ttl(self.ttl))
        await pipe.execute()

    async def release(self, token: str, consumer: str) -> None:
        await self.redis.zadd(self.key("l", token), {consumer: time.time()}, xx=True)

    async def last_watched(self, token: str) -> float | None:
        top = await self.redis.zrevrange(self.key("l", token), 0, 0, withscores=True)
        return float(top[0][1]) if top else None

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await self.redis.aclose()


