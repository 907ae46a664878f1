"""The Redis resume store under hostile faults (issue 18), against a real redis-server: a reader that falls behind
the per-stream trim is told so (``EventsGone`` before its body, a cut after), never jumped ahead; and a reset of
every client connection (``CLIENT KILL TYPE normal``) mid-stream loses nothing: each mirror retries, picks up after
what Redis holds and writes its end marker, and readers on another replica carry on from their cursor."""

from __future__ import annotations

import asyncio
import logging

import pytest
import redis.asyncio as aioredis

from eloquent_plugins.transports.resume.base import StreamMeta
from eloquent_plugins.transports.resume.log import EventsGone, StreamLog
from eloquent_plugins.transports.resume.redis_store import RedisSource, RedisStore
from tests.support.servers import redis_server

META = StreamMeta("s-1", "owner", 200, ((b"content-type", b"text/event-stream"),), "/v1/chat/completions", "openai")
GUARD = 60.0
"""Seconds a scenario may take before it counts as a hang (never reached when things work)."""


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


def frame(i: int) -> bytes:
    return b"data: {\"n\": %d}\n\n" % i


async def read(source: RedisSource, cursor: int, *, until: int | None = None) -> tuple[list[bytes], int]:
    """Read as a connection does (take, ended, wait) until the source ends or ``until`` frames came."""
    out: list[bytes] = []
    wake = asyncio.get_running_loop().create_future()
    while until is None or len(out) < until:
        frames = source.take(cursor)
        if frames:
            out.extend(frames)
            cursor += len(frames)
            continue
        if source.ended(cursor):
            break
        await source.wait(cursor, 0.2, wake)
    return out, cursor


async def mirrored(redis: aioredis.Redis, store: RedisStore, token: str, count: int) -> None:
    """Wait until the producer's mirror has written ``count`` events to Redis."""
    key = store.key("s", token)
    while True:
        last = await redis.xrevrange(key, max="+", min="-", count=1)
        if last and int(last[0][0].partition(b"-")[0]) >= count - 1:
            return
        await asyncio.sleep(0.01)


async def test_a_reader_that_falls_behind_the_trim_is_cut_never_jumped(redis_url, caplog):
    """Issue 18 item 2: max_stream_events=200, 3000 events, the reading replica pauses (here: does not read)
    while the producer writes far past the trim. The old reader rebased to whatever arrived and went on to a
    clean end with 1,292 events missing and as many repeated; now its body is cut after an exact prefix, and a
    resume from there is refused (410 events_expired) before any body."""
    producer = RedisStore(redis_url + "?max_stream_events=200&prefix=pause", ttl=30)
    replica = RedisStore(redis_url + "?prefix=pause", ttl=30)
    admin = aioredis.Redis.from_url(redis_url)
    try:
        token = "P" * 22
        log = producer.new_log()
        await producer.create(token, META, log)
        for i in range(50):
            log.append(frame(i))
        await asyncio.wait_for(mirrored(admin, producer, token, 50), GUARD)
        source = await replica.open(token)
        assert isinstance(source, RedisSource)
        await source.check(0)
        got, cursor = await asyncio.wait_for(read(source, 0, until=50), GUARD)
        assert got == [frame(i) for i in range(50)]
        # The pause: this reader does not read while the producer writes 2950 more events (Redis keeps ~200).
        # (Paced so that the mirror keeps up: Redis's MAXLEN trim, not the local log's bound, drops the events.)
        for i in range(50, 3000):
            log.append(frame(i))
            if i % 100 == 0:
                await asyncio.wait_for(mirrored(admin, producer, token, i + 1), GUARD)
        log.close("complete")
        await producer.finish(token)
        assert await admin.xlen(producer.key("s", token)) < 1000  # the trim really happened
        with caplog.at_level(logging.WARNING, logger="eloquent_plugins.transports.resume"):
            rest, cursor = await asyncio.wait_for(read(source, cursor), GUARD)
        got += rest
        assert got == [frame(i) for i in range(len(got))], "events skipped or repeated"
        assert len(got) < 3000 and source.ended(cursor)
        assert source.end_reason == "disconnected" and source.gone  # a cut: the body ends without completing
        assert any("resume cut" in r.getMessage() for r in caplog.records)
        with pytest.raises(EventsGone):  # a resume from there: 410 events_expired before any body
            await (await replica.open(token)).check(cursor)
        await tail_replays_exactly(admin, producer, replica, token, 3000)
    finally:
        await admin.aclose()
        await producer.aclose()
        await replica.aclose()


async def tail_replays_exactly(admin: aioredis.Redis, producer: RedisStore, replica: RedisStore, token: str,
                               total: int) -> None:
    """The Redis copy is contiguous from its first entry to the end marker, and replays exactly from there."""
    entries = await admin.xrange(producer.key("s", token), min="-", max="+")
    first = int(entries[0][0].partition(b"-")[0])
    assert [e[0] for e in entries] == [b"%d-1" % i for i in range(first, total + 1)]
    tail = await replica.open(token)
    await tail.check(first)
    assert (await asyncio.wait_for(read(tail, first), GUARD))[0] == [frame(i) for i in range(first, total)]
    assert tail.end_reason == "complete"
    if first:
        with pytest.raises(EventsGone):
            await (await replica.open(token)).check(first - 1)


async def test_a_mirror_behind_the_local_bound_keeps_the_redis_copy_contiguous(redis_url):
    """3000 events appended at once with max_stream_events=200: the local log drops events before the mirror
    writes them. The Redis copy must not hold a hole in the middle (which a resume from before it would only
    meet mid-body): it is trimmed up to the hole, so such a resume is refused up front."""
    producer = RedisStore(redis_url + "?max_stream_events=200&prefix=burst", ttl=30)
    replica = RedisStore(redis_url + "?prefix=burst", ttl=30)
    admin = aioredis.Redis.from_url(redis_url)
    try:
        token = "B" * 22
        log = producer.new_log()
        await producer.create(token, META, log)
        for i in range(3000):
            log.append(frame(i))
            if i % 100 == 0:
                await asyncio.sleep(0)
        log.close("complete")
        await producer.finish(token)
        await tail_replays_exactly(admin, producer, replica, token, 3000)
    finally:
        await admin.aclose()
        await producer.aclose()
        await replica.aclose()


STREAMS = 10
EVENTS = 400


async def test_client_kill_mid_stream_loses_nothing(redis_url):
    """Issue 18 item 3: every client connection is killed (three times) while 10 streams are mirrored and read on
    another replica. Each mirror retries and resumes after what Redis holds: every Redis copy ends up holding
    each event exactly once and the end marker; the remote readers survive; resumes give the exact events."""
    producer = RedisStore(redis_url + "?prefix=kill", ttl=30)
    replica = RedisStore(redis_url + "?prefix=kill", ttl=30)
    admin = aioredis.Redis.from_url(redis_url)
    logs: dict[str, StreamLog] = {}
    try:
        for n in range(STREAMS):
            token = f"{n}".rjust(22, "K")
            logs[token] = producer.new_log()
            await producer.create(token, META, logs[token])
        readers = {}
        for token in list(logs)[::2]:  # half the streams are being read on the other replica meanwhile
            source = await replica.open(token)
            assert isinstance(source, RedisSource)
            await source.check(0)
            readers[token] = (source, asyncio.ensure_future(read(source, 0)))
        kills = 0
        for i in range(EVENTS):
            for log in logs.values():
                log.append(frame(i))
            if i % 10 == 0:
                await asyncio.sleep(0.002)
            if i in (100, 220, 330):
                kills += await admin.execute_command("CLIENT", "KILL", "TYPE", "normal")  # SKIPME yes: not us
        assert kills >= 3 * STREAMS // 2  # the blocked readers' connections, at least, were reset each time
        for log in logs.values():
            log.close("complete")
        await asyncio.gather(*(producer.finish(token) for token in logs))
        expected = [frame(i) for i in range(EVENTS)]
        for token in logs:
            entries = await admin.xrange(producer.key("s", token), min="-", max="+")
            assert [e[0] for e in entries] == [b"%d-1" % i for i in range(EVENTS + 1)], "written twice or skipped"
            assert [e[1][b"f"] for e in entries[:-1]] == expected
            assert entries[-1][1] == {b"end": b"complete"}
            assert await admin.ttl(producer.key("s", token)) <= 30  # the final TTL, not the live one
        for token, (source, task) in readers.items():
            got, _cursor = await asyncio.wait_for(task, GUARD)
            assert got == expected and source.end_reason == "complete", token
        for token in logs:  # "the other replica": a fresh resume of every stream, from the start and mid-way
            for start in (0, 157):
                source = await replica.open(token)
                await source.check(start)
                got, _cursor = await asyncio.wait_for(read(source, start), GUARD)
                assert got == expected[start:] and source.end_reason == "complete"
    finally:
        await admin.aclose()
        await producer.aclose()
        await replica.aclose()


async def test_a_mirror_that_cannot_reach_redis_gives_up_loudly_and_readers_see_a_cut(redis_url, caplog):
    """Past its retry ceiling the mirror stops with one error line and drops the heartbeat: a reader on another
    replica ends its body cut, never with a complete-looking end."""
    producer = RedisStore(redis_url + "?prefix=giveup", ttl=30)
    replica = RedisStore(redis_url + "?prefix=giveup", ttl=30)
    producer.mirror_retry_for = 0.5
    try:
        token = "G" * 22
        log = producer.new_log()
        await producer.create(token, META, log)
        log.append(frame(0))
        source = await replica.open(token)
        await source.check(0)
        got, cursor = await asyncio.wait_for(read(source, 0, until=1), GUARD)
        real_pipeline = producer.redis.pipeline

        class Refused:  # every write from the producer fails from now on (Redis itself stays healthy)
            def __init__(self) -> None:
                self.inner = real_pipeline(transaction=False)

            def __getattr__(self, name: str):
                return getattr(self.inner, name)

            async def execute(self) -> None:
                raise ConnectionError("connection refused")

        producer.redis.pipeline = lambda transaction=False: Refused()
        with caplog.at_level(logging.ERROR, logger="eloquent_plugins.transports.resume"):
            log.append(frame(1))
            log.close("complete")
            await asyncio.wait_for(producer._local[token][2], GUARD)
        gave_up = [r for r in caplog.records if "gave up" in r.getMessage()]
        assert len(gave_up) == 1
        rest, cursor = await asyncio.wait_for(read(source, cursor), GUARD)
        assert got + rest == [frame(0)] and source.ended(cursor) and source.end_reason == "disconnected"
    finally:
        await producer.aclose()
        await replica.aclose()
