"""Redis Streams store: several replicas behind a load balancer share resumable streams.

Layout (``prefix`` defaults to ``eloquent``): ``{prefix}:m:{token}`` holds the stream's meta JSON,
``{prefix}:s:{token}`` is a Redis stream whose entry ``<index>-1`` holds event ``index``'s frame (field ``f``)
and whose last entry, ``<n>-1`` with field ``end``, marks the end, and ``{prefix}:l:{token}`` is a sorted set of
reader leases (score: lease end, Unix time; a reader that leaves sets it to the time it left). The producing
replica serves its own readers from memory and mirrors the log to Redis in pipelined batches (one round trip per
batch, not per event); other replicas read with ``XREAD BLOCK``. Keys expire ``resume_ttl`` seconds after the
stream ends (refreshed while it is live), and each stream keeps at most ``max_stream_events`` entries
(``XADD MAXLEN ~``).

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

log = logging.getLogger("eloquent_plugins.transports.resume")

LIVE_TTL_MIN = 60.0
"""A live stream's keys expire this long (at least) after the producer last refreshed them: a crashed producer
leaves no stream behind forever."""
HEARTBEAT_TTL = 15
"""Seconds a live stream's heartbeat key outlives the producer's last refresh (every HEARTBEAT_TTL / 3 s). A
reader that finds it gone while the stream has no end knows the producing replica died: it ends the body
without completing it instead of waiting for the keys to expire."""
_OUR_OPTIONS = ("prefix", "max_stream_events")


def _entry_id(index: int) -> str:
    return f"{index}-1"


def _after_id(cursor: int) -> str:
    """The XREAD id that returns entries with index >= cursor."""
    return "0-0" if cursor <= 0 else f"{cursor - 1}-1"


def _index(entry_id: bytes | str) -> int:
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(text.partition("-")[0])


class RedisSource:
    """A stream produced on another replica, read from Redis."""

    def __init__(self, store: RedisStore, token: str, meta: StreamMeta) -> None:
        self.meta = meta
        self._store = store
        self._key = store.key("s", token)
        self._heartbeat = store.key("h", token)
        self._buffer: list[bytes] = []
        self._buffer_base = 0
        self._end: int | None = None
        self.end_reason: str | None = None
        self._read_through = 0
        """Entries with index < this have been fetched."""

    def _absorb(self, entries: list[tuple[bytes, dict[bytes, bytes]]]) -> None:
        for entry_id, fields in entries:
            index = _index(entry_id)
            if index < self._read_through:
                continue
            if b"end" in fields:
                self._end = index
                self.end_reason = fields[b"end"].decode()
                self._read_through = index + 1
                continue
            if not self._buffer:
                self._buffer_base = index
            elif index != self._buffer_base + len(self._buffer):
                raise EventsGone(f"events before {index} are no longer kept")
            self._buffer.append(fields[b"f"])
            self._read_through = index + 1

    async def check(self, cursor: int) -> None:
        entries = await self._store.redis.xrange(self._key, min=f"{cursor}-0", max="+", count=1000)
        if entries:
            first = _index(entries[0][0])
            if first > cursor:
                raise EventsGone(f"events before {first} are no longer kept")
        else:
            last = await self._store.redis.xrevrange(self._key, max="+", min="-", count=1)
            if last and b"end" in last[0][1]:
                self.end_reason = last[0][1][b"end"].decode()
                if cursor > _index(last[0][0]):
                    raise ValueError(f"event {cursor - 1} was never sent on this stream")
        self._read_through = cursor
        self._absorb(entries)

    def take(self, cursor: int) -> list[bytes]:
        """Buffered frames from ``cursor`` on; frames before ``cursor`` are dropped (the reader has them)."""
        buffer = self._buffer
        if not buffer:
            return []
        start = cursor - self._buffer_base
        if start > 0:
            del buffer[:start]
            self._buffer_base = cursor
        return buffer[:]

    def ended(self, cursor: int) -> bool:
        return self._end is not None and cursor >= self._end

    async def wait(self, cursor: int, timeout: float, wake: asyncio.Future[None]) -> None:
        if self._buffer or self._end is not None:
            return
        block = max(1, int(min(timeout, 1.0) * 1000))
        result = await self._store.redis.xread({self._key: _after_id(max(cursor, self._read_through))},
                                               count=1000, block=block)
        for _key, entries in result or ():
            self._absorb(entries)
        if result:
            return
        pipe = self._store.redis.pipeline(transaction=False)
        pipe.exists(self._key)
        pipe.exists(self._heartbeat)
        stream_exists, producer_alive = await pipe.execute()
        if not stream_exists:
            raise EventsGone("the stream expired while it was being read")
        if not producer_alive and self._end is None:
            # The producing replica stopped without writing an end: end this body uncompleted ("disconnected"),
            # so the client sees a cut stream rather than a silent one; a later resume gets the same answer.
            log.warning("stream %s: producer heartbeat lost; ending the resume uncompleted", self._key)
            self._end = max(cursor, self._read_through)
            self.end_reason = "disconnected"

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
        except ValueError:
            raise ConfigError(f"max_stream_events must be an integer in {url!r}") from None
        self.ttl = ttl
        self.url = urlunsplit(parts._replace(query=urlencode(rest)))
        # Each remote reader holds one connection while it blocks in XREAD: allow many (redis-py's URL option
        # ``max_connections`` overrides), and wait for a free one rather than fail.
        max_connections = 4096 if "max_connections" not in dict(rest) else None
        pool = aioredis.BlockingConnectionPool.from_url(self.url, timeout=30, **(
            {"max_connections": max_connections} if max_connections else {}))
        self.redis: Any = aioredis.Redis(connection_pool=pool, decode_responses=False)
        self._local: dict[str, tuple[StreamMeta, StreamLog, asyncio.Task[None]]] = {}

    def key(self, kind: str, token: str) -> str:
        return f"{self.prefix}:{kind}:{token}"

    def new_log(self) -> StreamLog:
        return StreamLog(max_events=self.max_stream_events)

    async def create(self, token: str, meta: StreamMeta, log_: StreamLog) -> None:
        live_ttl = int(max(self.ttl, LIVE_TTL_MIN)) + 1
        await self.redis.set(self.key("m", token), meta.to_json(), ex=live_ttl)
        await self.redis.set(self.key("h", token), b"1", ex=HEARTBEAT_TTL)
        task = asyncio.get_running_loop().create_task(self._mirror(token, log_),
                                                      name=f"eloquent-mirror-{meta.stream_id}")
        self._local[token] = (meta, log_, task)

    async def _mirror(self, token: str, log_: StreamLog) -> None:
        """Copy the local log to Redis in batches until it closes; then mark the end and set the final TTL."""
        skey, mkey, hkey = self.key("s", token), self.key("m", token), self.key("h", token)
        live_ttl = int(max(self.ttl, LIVE_TTL_MIN)) + 1
        beat_every = HEARTBEAT_TTL / 3
        changed = asyncio.Event()
        log_.listen(changed.set)
        cursor = 0
        last_refresh = time.monotonic()
        try:
            while True:
                try:
                    frames = log_.take(cursor)
                except EventsGone:
                    cursor = log_.base
                    continue
                if frames:
                    pipe = self.redis.pipeline(transaction=False)
                    for offset, frame in enumerate(frames):
                        pipe.xadd(skey, {b"f": frame}, id=_entry_id(cursor + offset),
                                  maxlen=self.max_stream_events, approximate=True)
                    if cursor == 0 or time.monotonic() - last_refresh > beat_every:
                        pipe.expire(skey, live_ttl)
                        pipe.expire(mkey, live_ttl)
                        pipe.set(hkey, b"1", ex=HEARTBEAT_TTL)
                        last_refresh = time.monotonic()
                    await pipe.execute()
                    cursor += len(frames)
                    continue
                if log_.closed:
                    pipe = self.redis.pipeline(transaction=False)
                    pipe.xadd(skey, {b"end": (log_.reason or "complete").encode()}, id=_entry_id(cursor))
                    ttl = max(1, int(self.ttl))
                    pipe.expire(skey, ttl)
                    pipe.expire(mkey, ttl)
                    pipe.expire(self.key("l", token), ttl)
                    pipe.delete(hkey)
                    await pipe.execute()
                    return
                changed.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), beat_every)
                if time.monotonic() - last_refresh > beat_every:
                    pipe = self.redis.pipeline(transaction=False)
                    pipe.expire(skey, live_ttl)
                    pipe.expire(mkey, live_ttl)
                    pipe.set(hkey, b"1", ex=HEARTBEAT_TTL)
                    await pipe.execute()
                    last_refresh = time.monotonic()
        except Exception:
            log.exception("mirroring stream %s to Redis failed; resumes on other replicas will miss it", token[:4])
        finally:
            log_.unlisten(changed.set)

    async def finish(self, token: str) -> None:
        entry = self._local.pop(token, None)
        if entry is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(entry[2]), 10.0)

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
        pipe.expire(key, int(max(self.ttl, LIVE_TTL_MIN)) + 1)
        await pipe.execute()

    async def release(self, token: str, consumer: str) -> None:
        await self.redis.zadd(self.key("l", token), {consumer: time.time()}, xx=True)

    async def last_watched(self, token: str) -> float | None:
        top = await self.redis.zrevrange(self.key("l", token), 0, 0, withscores=True)
        return float(top[0][1]) if top else None

    async def aclose(self) -> None:
        for _meta, _log, task in list(self._local.values()):
            task.cancel()
        await self.redis.aclose()

