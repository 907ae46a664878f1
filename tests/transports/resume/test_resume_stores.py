"""Replay stores: the memory store's TTL and bounds, and the Redis Streams store against a real redis-server
(a stream produced by one store instance, read by another as a second replica would)."""

from __future__ import annotations

import asyncio

import pytest

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.resume import create_store
from eloquent_plugins.transports.resume.base import StreamMeta
from eloquent_plugins.transports.resume.memory import MemoryLimits, MemoryStore
from eloquent_plugins.transports.resume.redis_store import RedisSource, RedisStore
from eloquent_plugins.transports.resume.log import EventsGone
from tests.support.servers import redis_server

META = StreamMeta("s-1", "owner", 200, ((b"content-type", b"text/event-stream"),), "/v1/chat/completions", "openai")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


async def read_all(source, cursor: int = 0) -> list[bytes]:
    out: list[bytes] = []
    fut = asyncio.get_running_loop().create_future()
    for _ in range(200):
        frames = source.take(cursor)
        out.extend(frames)
        cursor += len(frames)
        if source.ended(cursor):
            return out
        await source.wait(cursor, 0.2, fut)
    raise AssertionError("stream did not end")


async def test_memory_store_keeps_finished_streams_for_the_ttl():
    clock = Clock()
    store = MemoryStore(ttl=10, clock=clock)
    log = store.new_log()
    await store.create("t" * 22, META, log)
    log.append(b"a")
    log.close("complete")
    await store.finish("t" * 22)
    source = await store.open("t" * 22)
    assert source is not None and source.meta == META and await read_all(source) == [b"a"]
    clock.now += 11
    assert await store.open("t" * 22) is None


async def test_memory_store_bounds_streams_and_bytes():
    store = MemoryStore(ttl=1000, limits=MemoryLimits(max_streams=3, max_stream_events=4, max_total_bytes=10**6))
    for i in range(5):
        log = store.new_log()
        await store.create(f"{i}" * 22, META, log)
        for j in range(10):
            log.append(b"%d" % j)
        log.close("complete")
        await store.finish(f"{i}" * 22)
    assert len(store) <= 3 and await store.open("0" * 22) is None
    source = await store.open("4" * 22)
    with pytest.raises(EventsGone):
        await source.check(0)
    await source.check(9)
    with pytest.raises(ValueError):
        await source.check(12)


async def test_memory_store_leases():
    import time

    store = MemoryStore()
    await store.create("L" * 22, META, store.new_log())
    assert await store.last_watched("L" * 22) is None
    await store.lease("L" * 22, "c1", 30.0)
    assert await store.last_watched("L" * 22) > time.time() + 20
    await store.release("L" * 22, "c1")
    assert time.time() - 5 < await store.last_watched("L" * 22) <= time.time()


def test_store_urls():
    assert isinstance(create_store(StreamConfig()), MemoryStore)
    with pytest.raises(ConfigError):
        create_store(StreamConfig(resume_store="memory://?max_streams=zero"))
    with pytest.raises(ConfigError):
        create_store(StreamConfig(resume_store="memory://?bogus=1"))


async def test_redis_stream_is_readable_from_another_replica(redis_url):
    producer = RedisStore(redis_url, ttl=30)
    replica = RedisStore(redis_url, ttl=30)
    try:
        token = "R" * 22
        log = producer.new_log()
        await producer.create(token, META, log)
        source = await replica.open(token)
        assert isinstance(source, RedisSource) and source.meta == META
        await source.check(0)
        reader = asyncio.ensure_future(read_all(source))
        for i in range(50):
            log.append(b"event %d" % i)
            if i % 10 == 0:
                await asyncio.sleep(0.01)
        log.close("complete")
        await producer.finish(token)
        assert await asyncio.wait_for(reader, 10) == [b"event %d" % i for i in range(50)]
        late = await replica.open(token)  # finished: replays from any point
        await late.check(47)
        assert await read_all(late, 47) == [b"event 47", b"event 48", b"event 49"]
        with pytest.raises(ValueError):
            await (await replica.open(token)).check(60)
        assert await replica.open("U" * 22) is None
        import time

        assert await producer.last_watched(token) is None
        await replica.lease(token, "c9", 30)
        assert await producer.last_watched(token) > time.time() + 20
        await replica.release(token, "c9")
        assert time.time() - 5 < await producer.last_watched(token) <= time.time()
    finally:
        await producer.aclose()
        await replica.aclose()


async def test_redis_trimmed_history_and_expiry(redis_url):
    producer = RedisStore(redis_url + "?max_stream_events=10&prefix=trim", ttl=1)
    replica = RedisStore(redis_url + "?prefix=trim", ttl=1)
    try:
        token = "T" * 22
        log = producer.new_log()
        await producer.create(token, META, log)
        for i in range(500):
            log.append(b"%d" % i)
        log.close("complete")
        await producer.finish(token)
        source = await replica.open(token)
        with pytest.raises(EventsGone):
            await source.check(0)
        await (await replica.open(token)).check(499)
        await asyncio.sleep(2.2)  # the TTL after the end
        assert await replica.open(token) is None
    finally:
        await producer.aclose()
        await replica.aclose()
