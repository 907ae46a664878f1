"""Issue 18's smaller faults, each on its own: a store that fails while a resume is leased on the producing replica
(503 with Retry-After, the stream not abandoned), a lone surrogate in ``model``, an id past a live Redis stream's
end on the replica that does not produce it, an empty ``Last-Event-ID`` / ``?last_event_id=``, the keep-alive
connection after an early 413, and ``EventsGone``'s base class."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.exceptions

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import EloquentError
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.transports.request_timeouts import header_timeout_protocol
from eloquent_plugins.transports.resume.base import StreamMeta
from eloquent_plugins.transports.resume.log import EventsGone, StreamLog
from eloquent_plugins.transports.resume.memory import MemoryStore
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.servers import UvicornThread, redis_server
from tests.support.streams import chat_maker, text_of

chat = chat_maker(max_tokens=300, prompt="edges {seed}", seed=3)


def test_events_gone_is_an_eloquent_error():
    assert issubclass(EventsGone, EloquentError)


# -- 4. the store fails while a resume is leased on the producing replica ---------------------------------------


class FlakyStore(MemoryStore):
    """A memory store whose Redis-facing calls fail like a Redis that is down, while ``down`` is set."""

    def __init__(self) -> None:
        super().__init__(ttl=60)
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise redis.exceptions.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

    async def lease(self, token: str, consumer: str, ttl: float) -> None:
        self._check()
        await super().lease(token, consumer, ttl)

    async def last_watched(self, token: str) -> float | None:
        self._check()
        return await super().last_watched(token)


async def read_events(response: httpx.Response, count: int | None = None) -> AsyncIterator[tuple[str, str]]:
    event_id = ""
    seen = 0
    async for line in response.aiter_lines():
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            yield event_id, line[6:]
            seen += 1
            if count is not None and seen >= count:
                return


async def test_a_store_failure_on_the_producing_replica_answers_503_and_does_not_abandon_the_stream():
    engine_app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.02))
    store = FlakyStore()
    grace = 1.5
    app = EloquentMiddleware(engine_app, StreamConfig(keepalive=0.5, resume_grace=grace), store=store)
    with UvicornThread(app) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            expected = []
            async with client.stream("POST", "/v1/chat/completions", json=chat(max_tokens=40)) as whole:
                expected = [data async for _i, data in read_events(whole)]

            got: list[str] = []
            async with client.stream("POST", "/v1/chat/completions", json=chat(max_tokens=40, tpot=0.1)) as first:
                last_id = ""
                async for last_id, data in read_events(first, 5):
                    got.append(data)
            left = time.monotonic()
            store.down = True
            for _ in range(2):  # refused for as long as the store is down, past the grace
                refused = await client.post("/v1/chat/completions", headers={"last-event-id": last_id})
                assert refused.status_code == 503, (refused.status_code, refused.text)
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["code"] == "resume_store_unavailable"
                await asyncio.sleep(grace * 0.8)
            assert time.monotonic() - left > grace
            assert engine_app.state.engine.stats().aborted == 0  # not abandoned
            store.down = False
            async with client.stream("POST", "/v1/chat/completions", headers={"last-event-id": last_id}) as resumed:
                assert resumed.status_code == 200
                got += [data async for _i, data in read_events(resumed)]
            assert text_of(got) == text_of(expected) and got[-1] == "[DONE]"
    stats = engine_app.state.engine.stats()
    assert stats.aborted == 0 and stats.running == 0
    assert app.metrics.resumes.get("store_error") == 2


# -- 6a. a lone surrogate in the model name -------------------------------------------------------------------


async def test_a_lone_surrogate_in_model_gets_a_404_not_a_500():
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.0))
    body = b'{"model":"\\ud800","messages":[{"role":"user","content":"hi"}]}'
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        response = await client.post("/v1/chat/completions", content=body,
                                     headers={"content-type": "application/json"})
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and "\ufffd" in error["message"]


# -- 6b. an id past a live Redis stream's end, on the replica that does not produce it --------------------------


@pytest.fixture(scope="module")
def redis_url():
    with redis_server() as url:
        yield url


async def test_an_index_not_yet_sent_on_a_live_redis_stream_is_refused_on_the_other_replica(redis_url):
    from eloquent_plugins.transports.resume.redis_store import SENT_WAIT, RedisStore

    producer, other = RedisStore(redis_url), RedisStore(redis_url)
    log = StreamLog()
    token = "t" * 22
    try:
        await producer.create(token, StreamMeta("s-x", "", 200, ()), log)
        for i in range(5):
            log.append(b"id: %s:%d\ndata: %d\n\n" % (token.encode(), i, i))
        deadline = time.monotonic() + 10
        while len(await other.redis.xrange(producer.key("s", token))) < 5:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        source = await other.open(token)
        assert source is not None
        await source.check(5)  # after event 4: the last one sent
        started = time.monotonic()
        for cursor in (6, 51):  # after event 5 (not sent yet), after event 50
            source = await other.open(token)
            with pytest.raises(ValueError, match="never sent"):
                await source.check(cursor)
        assert time.monotonic() - started >= 2 * SENT_WAIT * 0.9
        # An event the producer sends while the resume waits for it (the mirror a batch behind) is accepted.
        source = await other.open(token)
        checking = asyncio.create_task(source.check(6))
        await asyncio.sleep(0.2)
        log.append(b"id: %s:5\ndata: 5\n\n" % token.encode())
        await asyncio.wait_for(checking, SENT_WAIT + 5)
        assert source.take(6) == []
        log.close("complete")
    finally:
        await producer.finish(token)
        await producer.aclose()
        await other.aclose()


# -- 6c. an empty Last-Event-ID is no id ------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["header", "query"])
async def test_an_empty_last_event_id_starts_a_new_stream(how: str):
    engine_app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.0))
    app = EloquentMiddleware(engine_app, StreamConfig(keepalive=0))
    url, headers = "/v1/chat/completions", {}
    if how == "header":
        headers["last-event-id"] = ""
    else:
        url += "?last_event_id="
    with UvicornThread(app) as srv:
        async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
            async with client.stream("POST", url, json=chat(max_tokens=5), headers=headers) as response:
                assert response.status_code == 200 and response.headers.get("x-eloquent-stream")
                datas = [data async for _i, data in read_events(response)]
    assert datas[-1] == "[DONE]" and text_of(datas)
    assert app.metrics.resumes == {} and app.metrics.streams_started == 1


# -- 6d. no unrequested 408 after an early 413 ------------------------------------------------------------------


async def test_no_408_on_the_idle_connection_after_an_early_413():
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.0, max_body_bytes=1000))
    with UvicornThread(app, http=header_timeout_protocol(0.5)) as srv:
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        try:
            body = b'{"messages": []}' + b" " * 2000
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\n\r\n" % len(body))
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 413")
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            writer.write(body)  # the rest of the request the server answered early
            await writer.drain()
            with contextlib.suppress(asyncio.TimeoutError):
                extra = await asyncio.wait_for(reader.read(1000), 1.5)  # 3 header deadlines
                assert extra == b"", extra  # nothing, or the connection closed: never a 408
            # The connection is idle keep-alive again: the next request is served.
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200"), head
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
