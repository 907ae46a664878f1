"""Drain (issue 25): SIGTERM on ``eloquent serve`` with a long stream in flight. ``/ready`` turns unready before
the first refusal; a new stream gets ``503`` + ``Retry-After`` with a JSON body; the stream in flight keeps
receiving events until ``--drain-timeout``, is then handed over (its Redis copy holds every event the client got,
no end marker, the producer's heartbeat dropped at once rather than lapsing) and cut, and the replica exits 0.
A resume on the other replica then reads the rest of what Redis holds and the generation migrates there
(tests/transports/test_migration.py checks the spliced text whole): the stream goes on, ids continuing, nothing repeated.
Also the admin route's guard, in process."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator

import httpx
import pytest
import redis

from eloquent_plugins.cli.bench.replica import Replica
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.protocol import STREAM_HEADER
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.transports.drain import Drain
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.client_servers import CHAT, chat_body
from tests.support.servers import redis_server
from tests.support.streams import wait_until

DRAIN_TIMEOUT = 2
TOKENS = 1200  # 60 s at --tpot 0.05: far past the deadline


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[Replica, Replica, str]]:
    with redis_server() as store:
        args = ("--tpot", "0.05", "--ttft", "0.05", "--drain-timeout", str(DRAIN_TIMEOUT), "--log-level", "info",
                "--stream-transport", "sse")
        a, b = Replica("a", store, args), Replica("b", store, args)
        try:
            a.start()
            b.start()
            yield a, b, store
        finally:
            for r in (a, b):
                r.stop()
                print(f"---- replica {r.name}\n{r.log()[-4000:]}")


async def test_sigterm_drains_then_hands_the_stream_over(pair: tuple[Replica, Replica, str]) -> None:
    a, b, store = pair
    a.wait_ready()
    events: list[tuple[str, str]] = []  # (id, data)
    token = ""
    body_error: BaseException | None = None
    got_events = asyncio.Event()

    async def read_long_stream() -> None:
        nonlocal token, body_error
        parser = SSEParser()
        try:
            async with httpx.AsyncClient(timeout=60) as h, \
                    h.stream("POST", a.base + CHAT, json=chat_body("a long drained story", TOKENS)) as r:
                assert r.status_code == 200
                token = r.headers[STREAM_HEADER]
                async for chunk in r.aiter_bytes():
                    for message in parser.feed(chunk):
                        if message.data:
                            events.append((message.id or "", message.data))
                    if len(events) >= 5:
                        got_events.set()
        except httpx.HTTPError as exc:
            body_error = exc

    reader = asyncio.create_task(read_long_stream())
    await asyncio.wait_for(got_events.wait(), 30)
    before_signal = len(events)
    a.signal()
    await wait_until(lambda: not a.ready(), "/ready turns unready", timeout=30, interval=0.01)
    assert a.metric("eloquent_sse_drain_refused_total") == 0, "unready before the first refusal"
    assert a.metric("eloquent_sse_ready") == 0
    async with httpx.AsyncClient(timeout=30) as h:
        refused = await h.post(a.base + CHAT, json=chat_body("a new stream", 5))
        ready = await h.get(a.base + "/ready")
    assert refused.status_code == 503, refused.text
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["code"] == "draining"
    assert ready.status_code == 503 and ready.json()["draining"] is True
    assert a.metric("eloquent_sse_drain_refused_total") == 1

    await asyncio.wait_for(reader, 60)
    assert a.wait_exit(60) == 0, "the drained replica exits cleanly"
    # The stream ran on during the drain, then was cut: no [DONE], the body ended early.
    assert len(events) > before_signal, "the stream kept going during the drain"
    assert events[-1][1] != "[DONE]" and len(events) < TOKENS
    assert body_error is not None, "the client saw its body cut (it resumes elsewhere)"
    log = a.log()
    assert log.count("ended by drain") == 1, log[-3000:]
    assert "1 handed over" in log

    # The store's copy: every event the client got, no end, the heartbeat gone at once (it lapses 15 s after its
    # last refresh otherwise; this looks right after the exit).
    r = redis.Redis.from_url(store)
    entries = r.xrange(f"eloquent:s:{token}")
    assert len(entries) >= len(events)
    assert all(b"end" not in fields for _, fields in entries), "handed over, not ended"
    assert not r.exists(f"eloquent:h:{token}"), "the producer is marked gone now"

    # A resume on the other replica reads what Redis holds, then the generation migrates there: the stream goes
    # on past the copy, each id once and in order (20 events past it are enough: the splice is test_migration's).
    last_id = events[-1][0]
    resumed: list[tuple[str, str]] = []
    async with httpx.AsyncClient(timeout=60) as h, \
            h.stream("POST", b.base + CHAT, json=chat_body("a long drained story", TOKENS),
                     headers={"last-event-id": last_id}) as resp:
        assert resp.status_code == 200, resp.status_code
        parser = SSEParser()
        async for chunk in resp.aiter_bytes():
            resumed.extend((m.id or "", m.data) for m in parser.feed(chunk) if m.data)
            if len(events) + len(resumed) >= len(entries) + 20:
                break
    assert all(data != "[DONE]" and '"error"' not in data for _, data in resumed), resumed[-3:]
    indices = [int(i.rsplit(":", 1)[1]) for i, _ in events + resumed]
    assert indices == list(range(indices[0], indices[0] + len(indices))), "ids continue, each event once"
    assert b.metric("eloquent_migrations_total", 'outcome="migrated"') == 1, "migrated, not cut"


async def test_a_stream_handed_over_while_redis_lags_keeps_every_event(pair: tuple[Replica, Replica, str]) -> None:
    """Redis takes no writes across the drain's deadline (``CLIENT PAUSE ... WRITE``), so the stream's copy lags
    the events its client got when the hand-over begins. The hand-over must wait for that copy, and nothing on the
    replica may drop the events meanwhile (``eloquent bench load --restart-every`` once lost a stream that way:
    a resume met "sent but never copied"; the exchange's end dropped a handed-over log as an aborted one's)."""
    a, b, store = pair
    if not a.running:
        a.start()
    a.wait_ready()
    r = redis.Redis.from_url(store)
    events: list[tuple[str, str]] = []
    got_events = asyncio.Event()
    token = ""

    async def read_long_stream() -> None:
        nonlocal token
        parser = SSEParser()
        with contextlib.suppress(httpx.HTTPError):
            async with httpx.AsyncClient(timeout=60) as h, \
                    h.stream("POST", a.base + CHAT, json=chat_body("a story handed over in a lag", TOKENS)) as resp:
                token = resp.headers[STREAM_HEADER]
                async for chunk in resp.aiter_bytes():
                    events.extend((m.id or "", m.data) for m in parser.feed(chunk) if m.data)
                    if len(events) >= 5:
                        got_events.set()

    reader = asyncio.create_task(read_long_stream())
    await asyncio.wait_for(got_events.wait(), 30)
    await wait_until(lambda: r.xlen(f"eloquent:s:{token}") >= 5, "the copy caught up before the pause")
    r.execute_command("CLIENT", "PAUSE", str(int((DRAIN_TIMEOUT + 2) * 1000)), "WRITE")  # past the deadline
    a.signal()
    await asyncio.wait_for(reader, 60)
    assert a.wait_exit(60) == 0
    log = a.log().rsplit("---- start", 1)[-1]
    assert "ended by drain" in log, log[-3000:]
    held = r.xlen(f"eloquent:s:{token}")
    print(f"the client got {len(events)} events, {held} in Redis after the hand-over (paused across the deadline)")
    assert held >= len(events), f"Redis holds {held} events of the {len(events)} the client got: lost in the hand-over"
    assert not r.exists(f"eloquent:h:{token}"), "the producer is marked gone"
    a.start()  # for the tests after this one


# ---- the admin route, in process ---------------------------------------------------------------------------
def _app(token: str | None = None) -> tuple[EloquentMiddleware, httpx.AsyncClient]:
    config = StreamConfig(drain_timeout=5, drain_token=token)
    mw = EloquentMiddleware(create_engine_app(EngineConfig(tpot=0.0, ttft=0.0)), config)
    client = httpx.AsyncClient(transport=httpx.ASGITransport(mw, client=("127.0.0.1", 5000)),
                               base_url="http://replica")
    return mw, client


async def test_drain_route_needs_loopback_or_the_token() -> None:
    mw, client = _app()
    async with client:
        assert (await client.get("/eloquent/drain")).status_code == 405
        forwarded = await client.post("/eloquent/drain", headers={"x-forwarded-for": "203.0.113.9"})
        assert forwarded.status_code == 403 and forwarded.json()["error"]["code"] == "forbidden"
        assert (await client.get("/ready")).json() == {"ready": True, "draining": False, "in_flight": 0}
        started = await client.post("/eloquent/drain")
        assert started.status_code == 202 and started.json()["drain_timeout"] == 5
        assert (await client.get("/ready")).status_code == 503
        await asyncio.wait_for(mw.drain.wait(), 10)  # nothing in flight: done at once
        refused = await client.post(CHAT, json=chat_body("late", 3))
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert (await client.get("/v1/models")).status_code == 200, "GETs are still served"
    mw, client = _app(token="s3cret")
    async with client:
        assert (await client.post("/eloquent/drain")).status_code == 403, "a token is required once configured"
        assert (await client.post("/eloquent/drain", headers={"authorization": "Bearer nope"})).status_code == 403
        ok = await client.post("/eloquent/drain", headers={"authorization": "Bearer s3cret",
                                                           "x-forwarded-for": "203.0.113.9"})
        assert ok.status_code == 202 and json.loads(ok.text)["draining"] is True


def test_drain_timeout_reads_the_environment() -> None:
    assert StreamConfig.from_env({"ELOQUENT_DRAIN_TIMEOUT": "7"}).drain_timeout == 7
    assert StreamConfig.from_env({}).drain_timeout == 30
    assert Drain(3).ready


# ---- HTTP/3: GOAWAY, and the client takes a refused new stream to a new connection ----------------------------
async def test_http3_new_stream_refused_by_a_draining_server_goes_to_a_new_connection() -> None:
    from eloquent_client import EloquentClient

    from eloquent_plugins.transports.http3.lifecycle import ConnectionState
    from eloquent_plugins.transports.http3.server import start_http3_server
    from tests.support.udp_switch import start_switch

    def replica() -> EloquentMiddleware:
        return EloquentMiddleware(create_engine_app(EngineConfig(tpot=0.05, ttft=0.01)), StreamConfig())

    a, b = replica(), replica()
    srv_a = await start_http3_server(a, host="127.0.0.1", port=0, config=a.config, drain=a.drain)
    srv_b = await start_http3_server(b, host="127.0.0.1", port=0, config=b.config, drain=b.drain)
    switch = await start_switch(("127.0.0.1", srv_a.port))  # a layer-4 balancer: new sessions go to its target
    try:
        async with EloquentClient("https://127.0.0.1:9", transport="eloquent", verify=False, h3_port=switch.port,
                                  timeout=20) as client:
            async with client.stream("POST", CHAT, json=chat_body("in flight on a", 40)) as first:
                texts = []
                async for event in first.events():
                    texts.append(event.text or "")
                    if len(texts) == 3:
                        assert a.drain.begin("test")
                        switch.target = ("127.0.0.1", srv_b.port)  # the balancer now sends new sessions to b
                        await wait_until(lambda: any(c.lifecycle is ConnectionState.GOING_AWAY
                                                     for c in srv_a._state.connections), "GOAWAY")
                        async with client.stream("POST", CHAT, json=chat_body("new during the drain", 5)) as new:
                            assert new.status == 200 and await new.text()
                assert first.deliveries == ["datagram"]
        assert "".join(texts) and a.drain.refused == 1, "a refused it, once"
        assert b.metrics.streams_started == 1 and a.metrics.streams_started == 1, "b served the new stream"
        await asyncio.wait_for(a.drain.wait(), 20)  # the stream in flight finished: the drain is over
        assert a.drain.completed == 1 and a.drain.handed_over == 0
    finally:
        switch.close()
        await srv_a.close()
        await srv_b.close()
