"""The Redis store's producer side: the task that mirrors a live stream's local log to Redis (the key layout
is ``redis_layout``'s). It needs only what ``MirrorTarget`` names of the store, so it imports nothing of
``redis_store`` and can be driven on its own (``tests/transports/resume/test_redis_mirror_unit.py``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, Protocol

from eloquent_plugins.transports.resume.log import EventsGone, StreamLog
from eloquent_plugins.transports.resume.redis_layout import READ_BATCH, REPLY_TIMEOUT, entry_id, entry_index, live_ttl

log = logging.getLogger("eloquent_plugins.transports.resume")


class MirrorTarget(Protocol):
    """What a mirror reads of its store, at the moment it needs it (tests change the retry bounds on a live
    store): the client, the key layout's prefix, the TTLs, the per-stream cap and the retry bounds."""

    redis: Any
    ttl: float
    """Seconds a finished stream's keys are kept."""
    heartbeat_ttl: int
    max_stream_events: int
    retry_first: float
    retry_max: float
    mirror_retry_for: float
    """Seconds of failures after which the mirror gives up (``redis_layout.MIRROR_RETRY_FOR`` by default)."""

    def key(self, kind: str, token: str) -> str: ...


class Mirror:
    """Copies one local log to Redis in pipelined batches until it closes, then writes the end marker and the
    final TTL. A failed write is retried with bounded exponential backoff after reading back the last entry
    Redis holds (a pipeline cut by a connection reset may have applied part of its XADDs), so no entry is
    written twice or skipped; after ``mirror_retry_for`` s of failures it gives up with one error line and drops
    the heartbeat, so that readers on other replicas end their bodies cut rather than complete-looking."""

    def __init__(self, store: MirrorTarget, token: str, log_: StreamLog) -> None:
        self.store, self.token, self.log = store, token, log_
        self.skey, self.mkey, self.hkey = store.key("s", token), store.key("m", token), store.key("h", token)
        self.qkey = store.key("q", token)
        self.live_ttl = live_ttl(store.ttl)
        self.beat_every = store.heartbeat_ttl / 3
        self.cursor = 0
        """The index of the next event to write to Redis."""
        self.last_refresh = 0.0
        """When the TTLs and the heartbeat were last refreshed (0: refresh with the next write)."""
        self.trim_below = 0
        """When set, the next batch first drops the entries before it (see ``_step``)."""
        self.changed = asyncio.Event()
        self.handing_over = False
        """Set by ``hand_over``: copy what the log holds, then stop without an end marker."""

    async def run(self) -> None:
        store = self.store
        self.log.listen(self.changed.set)
        failing_since: float | None = None
        delay = store.retry_first
        try:
            while True:
                try:
                    if failing_since is not None and await self._resync():
                        return
                    if await self._step():
                        return
                    failing_since = None  # only a write that went through ends a run of failures
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - retried, then given up on loudly
                    now = time.monotonic()
                    if failing_since is None:
                        failing_since, delay = now, store.retry_first
                    left = store.mirror_retry_for - (now - failing_since)
                    if left <= 0:
                        log.error("mirroring stream %s to Redis failed for %.0f s (%r); gave up at event %d: "
                                  "resumes on other replicas end cut", self.token[:4], now - failing_since, exc,
                                  self.cursor)
                        await self._abandon()
                        return
                    log.debug("mirroring stream %s to Redis failed (%r); retrying", self.token[:4], exc)
                    await asyncio.sleep(min(delay, left))
                    delay = min(delay * 2, store.retry_max)
        finally:
            self.log.unlisten(self.changed.set)

    def hand_over(self) -> None:
        """The producer stops here without an end (drain deadline): finish copying, then drop the heartbeat."""
        self.handing_over = True
        self.changed.set()

    async def _execute(self, pipe: Any) -> None:
        await asyncio.wait_for(pipe.execute(), REPLY_TIMEOUT)

    async def _resync(self) -> bool:
        """Continue after what Redis holds; True when the end marker is already there (then finish the TTLs)."""
        last = await asyncio.wait_for(self.store.redis.xrevrange(self.skey, max="+", min="-", count=1),
                                      REPLY_TIMEOUT)
        self.last_refresh = 0.0
        if not last:
            self.cursor = 0  # nothing there (or the key was lost): write what the log still holds
            return False
        self.cursor = entry_index(last[0][0]) + (0 if b"end" in last[0][1] else 1)
        if b"end" in last[0][1]:
            await self._execute(self._final_ttls(self.store.redis.pipeline(transaction=False)))
            return True
        return False

    def _refresh(self, pipe: Any) -> None:
        pipe.expire(self.skey, self.live_ttl)
        pipe.expire(self.mkey, self.live_ttl)
        pipe.expire(self.qkey, self.live_ttl)
        pipe.set(self.hkey, b"1", ex=self.store.heartbeat_ttl)

    def _final_ttls(self, pipe: Any) -> Any:
        ttl = max(1, int(self.store.ttl))
        pipe.expire(self.skey, ttl)
        pipe.expire(self.mkey, ttl)
        pipe.delete(self.qkey)  # a finished stream is never continued: its request need not outlive it
        pipe.expire(self.store.key("l", self.token), ttl)
        pipe.delete(self.hkey)
        return pipe

    async def _step(self) -> bool:
        """Write one batch, or the end, or wait for the log to change; True when the end is written."""
        log_, store = self.log, self.store
        try:
            frames = log_.take(self.cursor)
        except EventsGone:
            # The local log dropped them before they were written: trim Redis up to there too, so that the copy
            # stays contiguous (a resume from before the hole is refused up front, not cut in the middle).
            self.cursor = self.trim_below = log_.base
            return False
        if frames:
            frames = frames[:READ_BATCH]
            pipe = store.redis.pipeline(transaction=False)
            if self.trim_below:
                pipe.xtrim(self.skey, minid=entry_id(self.trim_below), approximate=False)
            for offset, frame in enumerate(frames):
                pipe.xadd(self.skey, {b"f": frame}, id=entry_id(self.cursor + offset),
                          maxlen=store.max_stream_events, approximate=True)
            refresh = time.monotonic() - self.last_refresh > self.beat_every
            if refresh:
                self._refresh(pipe)
            await self._execute(pipe)
            self.trim_below = 0
            if refresh:
                self.last_refresh = time.monotonic()
            self.cursor += len(frames)
            return False
        if self.handing_over:  # before the end: a log closed during the hand-over ended only here
            await self._execute(store.redis.pipeline(transaction=False).delete(self.hkey))
            log.info("stream %s handed over at event %d: heartbeat dropped, no end written", self.token[:4],
                     self.cursor)
            return True
        if log_.closed:
            pipe = store.redis.pipeline(transaction=False)
            pipe.xadd(self.skey, {b"end": (log_.reason or "complete").encode()}, id=entry_id(self.cursor))
            await self._execute(self._final_ttls(pipe))
            return True
        self.changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.changed.wait(), self.beat_every)
        if time.monotonic() - self.last_refresh > self.beat_every:
            pipe = store.redis.pipeline(transaction=False)
            self._refresh(pipe)
            await self._execute(pipe)
            self.last_refresh = time.monotonic()
        return False

    async def _abandon(self) -> None:
        """Drop the heartbeat (best effort): remote readers then end cut at once instead of after its TTL."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.store.redis.delete(self.hkey), 2.0)
