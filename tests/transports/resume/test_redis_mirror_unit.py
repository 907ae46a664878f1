"""The mirror on its own: driven through ``MirrorTarget`` (a client, a prefix, TTLs and retry bounds), not a whole
``RedisStore``, against a real redis-server. It copies a log to the key layout of ``redis_layout`` in order,
writes the end marker and the final TTLs, hands over without an end, and gives up on an unreachable Redis after
its retry bound instead of retrying forever."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis.asyncio as aioredis

from eloquent_plugins.transports.resume.log import StreamLog
from eloquent_plugins.transports.resume.redis_layout import entry_index, redis_key
from eloquent_plugins.transports.resume.redis_mirror import Mirror, MirrorTarget
from tests.support.servers import free_port, redis_server

GUARD = 30.0
"""Seconds a mirror may take before it counts as a hang (never reached when things work)."""


@dataclass
class Target:
    """Just what a mirror needs of its store."""

    redis: Any
    prefix: str
    ttl: float = 120.0
    heartbeat_ttl: int = 15
    max_stream_events: int = 1000
    retry_first: float = 0.01
    retry_max: float = 0.05
    mirror_retry_for: float = 20.0

    def key(self, kind: str, token: str) -> str:
        return redis_key(self.prefix, kind, token)


@pytest.fixture(scope="module")
def redis_url() -> Any:
    with redis_server() as url:
        yield url


@pytest.fixture
async def target(redis_url: str, request: pytest.FixtureRequest) -> AsyncIterator[Target]:
    client = aioredis.Redis.from_url(redis_url)
    yield Target(client, prefix=f"unit-{request.node.name}")
    await client.aclose()


async def entries(target: Target, token: str) -> list[tuple[int, dict[bytes, bytes]]]:
    raw = await target.redis.xrange(target.key("s", token), min="-", max="+")
    return [(entry_index(i), fields) for i, fields in raw]


def frames(n: int, start: int = 0) -> list[bytes]:
    return [f"data: {i}\n\n".encode() for i in range(start, start + n)]


async def test_a_closed_log_is_copied_in_order_with_its_end_and_final_ttls(target: Target) -> None:
    stream: MirrorTarget = target  # the protocol is all the mirror sees
    log = StreamLog()
    for f in frames(5):
        log.append(f)
    log.close("complete")
    await target.redis.set(target.key("h", "t1"), b"1")
    await asyncio.wait_for(Mirror(stream, "t1", log).run(), GUARD)

    got = await entries(target, "t1")
    assert got == [*((i, {b"f": f}) for i, f in enumerate(frames(5))), (5, {b"end": b"complete"})]
    assert await target.redis.exists(target.key("h", "t1")) == 0, "the heartbeat goes with the end"
    assert 0 < await target.redis.ttl(target.key("s", "t1")) <= target.ttl


async def test_a_hand_over_copies_what_the_log_holds_then_drops_the_heartbeat_without_an_end(target: Target) -> None:
    log = StreamLog()
    for f in frames(3):
        log.append(f)
    await target.redis.set(target.key("h", "t2"), b"1")
    mirror = Mirror(target, "t2", log)
    task = asyncio.get_running_loop().create_task(mirror.run())
    async with asyncio.timeout(GUARD):
        while len(await entries(target, "t2")) < 3:
            await asyncio.sleep(0.01)
        for f in frames(2, start=3):
            log.append(f)
        mirror.hand_over()
        await task
    got = await entries(target, "t2")
    assert got == [(i, {b"f": f}) for i, f in enumerate(frames(5))], "every event, and no end marker"
    assert await target.redis.exists(target.key("h", "t2")) == 0, "readers elsewhere see the producer gone"


async def test_an_unreachable_redis_is_given_up_on_after_mirror_retry_for(caplog: pytest.LogCaptureFixture) -> None:
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    target = Target(client, prefix="gone", mirror_retry_for=0.3)
    log = StreamLog()
    log.append(b"data: 0\n\n")
    log.close("complete")
    with caplog.at_level("ERROR", logger="eloquent_plugins.transports.resume"):
        await asyncio.wait_for(Mirror(target, "t3", log).run(), GUARD)  # returns: no retrying forever
    await client.aclose()
    assert any("gave up at event 0" in r.getMessage() for r in caplog.records), caplog.text
