"""Faults, each on real servers: the engine dying mid-stream (SSE and HTTP/3), Redis dying under the SSE
middleware, the client's network vanishing for longer than the QUIC idle timeout, and the server restarting while
clients hold resume tokens (memory store: a clear 404; Redis store: the resume works on the new instance).

Every wait is bounded by a generous guard (``GUARD``) so that a hang fails the test instead of stalling the run;
no assertion depends on how fast the machine is."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any, Self

import httpx
import pytest
from eloquent_client import ClientError, EloquentClient, StreamFailed

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.sim.netem import Outage
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.http3.server import start_http3_server
from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.core.sse_reader import SSEParser
from tests.support.servers import (
    UvicornProcess,
    UvicornThread,
    free_port,
    wait_for_port,
)
from tests.support.streams import chat_maker, text_of, wait_until

GUARD = 60.0
"""Seconds any single fault scenario may take before it counts as a hang (never reached when things work)."""


chat = chat_maker(max_tokens=20, seed=1, prompt="fault {seed}", model="eloquent-builtin")
wait_until = functools.partial(wait_until, timeout=GUARD, interval=0.05)
"""Poll a predicate until it holds; a guard, not a timing assertion."""


class RedisProcess:
    """A throwaway redis-server that the test can kill (``tests.support.servers.redis_server`` hides its process)."""

    def __init__(self) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install -y redis-server)")
        self.exe = exe
        self.port = free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="eloquent-faults-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def __enter__(self) -> Self:
        self.proc = subprocess.Popen([self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self._tmp.name, "--protected-mode", "no"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        wait_for_port(self.port, proc=self.proc)
        return self

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._tmp.cleanup()


async def sse_post(client: httpx.AsyncClient, body: Any, **headers: str) -> tuple[httpx.Response, list[Any]]:
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as response:
        raw = b"".join([chunk async for chunk in response.aiter_raw()])
    return response, SSEParser().feed(raw)


# --- 1. The engine dies mid-stream -----------------------------------------------------------------------------
#
# Over SSE this is already shown by tests/transports/sse/test_sse_middleware.py::test_engine_error_after_200_is_an_in_band_openai_error
# (OpenAI error event then [DONE], the stream ends cleanly, a Last-Event-ID resume replays the error, the openai
# SDK raises APIError) and ::test_engine_error_in_tgi_and_triton_formats (TGI and Triton formats). What is
# missing is HTTP/3: below, the same engine behind the middleware, served by the HTTP/3 front end.

async def test_engine_death_over_http3_eloquent_and_h3_stream_with_resume() -> None:
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.002, raise_errors=True))
    engine = app.state.engine
    wrapped = EloquentMiddleware(app, StreamConfig(keepalive=0.5, resume_grace=0.5))
    srv = await start_http3_server(wrapped, host="127.0.0.1", port=0, config=StreamConfig())
    try:
        async def scenario() -> None:
            base = f"https://127.0.0.1:{srv.port}"
            # Eloquent datagrams: the app's exception becomes the in-band error event; the trailer still comes.
            async with EloquentClient(base, verify=False) as client, \
                    client.stream("POST", "/v1/chat/completions", json=chat(40, seed=1, fail_after=5)) as s:
                with pytest.raises(StreamFailed) as failed:
                    await s.text()
                assert s.delivery == "eloquent"
                rendered = list(s.rendered)
                trailer = s.h3._assembler.trailer
            # Datagram requests go through the middleware too (ids, resume), so the app's exception arrives as the
            # route's in-band error event (then [DONE], which the client does not render after the error), exactly
            # as on the SSE path.
            assert [e.kind for e in rendered[:-1]] == ["data"] * (len(rendered) - 1) and len(rendered) >= 2
            error = rendered[-1]
            assert "fail_after" in json.loads(error.data)["error"]["message"]
            assert "fail_after" in str(failed.value)
            # The client stops at the in-band error (it raises StreamFailed), so it may not wait for the trailer;
            # when it got it, the trailer counts the closing [DONE] as well.
            assert trailer is None or trailer.count == len(rendered) + 1
            assert [e.index for e in rendered] == list(range(len(rendered)))

            # The reliable HTTP/3 stream goes through the middleware: in-band OpenAI error + [DONE], resumable.
            async with EloquentClient(base, transport="h3-stream", verify=False) as client:
                async def sse_over_h3(body: Any, **headers: str) -> tuple[int, dict[str, str], list[Any]]:
                    conn = await client.connection()
                    h3 = await conn.request("POST", "/v1/chat/completions", body=json.dumps(body).encode(),
                                            headers=[("content-type", "application/json"),
                                                     ("accept", "text/event-stream"), *headers.items()])
                    try:
                        await h3.wait_headers(GUARD)
                        if h3.status != 200:
                            return h3.status or 0, h3.headers, []
                        return h3.status, h3.headers, [e async for e in h3.events()]
                    finally:
                        h3.cancel()

                status, headers, events = await sse_over_h3(chat(40, seed=2, fail_after=5))
                assert status == 200
                token = headers["x-eloquent-stream"]
                assert events[-1].data == "[DONE]"
                err = json.loads(events[-2].data)["error"]
                assert "fail_after" in err["message"] and set(err) >= {"message", "type", "code"}
                assert all(e.id and e.id.startswith(token + ":") for e in events)
                # Resume from just before the error: the error and [DONE] again, with the same ids.
                status, _, replay = await sse_over_h3({}, **{"last-event-id": events[-3].id})
                assert status == 200
                assert [(e.id, e.data) for e in replay] == [(e.id, e.data) for e in events[-2:]]
                # From the start (token alone): the whole stream, error included, without a second engine run.
                status, _, whole = await sse_over_h3({}, **{"last-event-id": token})
                assert status == 200 and [e.data for e in whole] == [e.data for e in events]
                # Everything after the end: 204.
                status, _, _ = await sse_over_h3({}, **{"last-event-id": events[-1].id})
                assert status == 204
            stats = engine.stats()
            assert stats.failed == 2 and stats.running == 0 and stats.completed == 0

        await asyncio.wait_for(scenario(), GUARD)
    finally:
        await srv.close()


# --- 2. Redis becomes unavailable ------------------------------------------------------------------------------

async def test_redis_dying_keeps_serving_new_streams_and_resumes_get_503() -> None:
    engine_app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.005))
    with RedisProcess() as redis:
        app = EloquentMiddleware(engine_app, StreamConfig(keepalive=0.5, resume_store=redis.url, resume_grace=0.5,
                                                          resume_ttl=60))
        with UvicornThread(app) as srv:
            async def scenario() -> None:
                async with httpx.AsyncClient(base_url=srv.url, timeout=GUARD) as client:
                    # While Redis is up: a resumable stream.
                    first, first_msgs = await sse_post(client, chat(10, seed=1))
                    token = first.headers["x-eloquent-stream"]
                    assert all(m.id and m.id.startswith(token) for m in first_msgs)
                    ok = await client.post("/v1/chat/completions", headers={"last-event-id": first_msgs[3].id})
                    assert ok.status_code == 200

                    # A long stream in flight when Redis dies.
                    live_datas: list[str] = []
                    async with client.stream("POST", "/v1/chat/completions", json=chat(200, seed=2)) as live:
                        live_token = live.headers["x-eloquent-stream"]
                        parser = SSEParser()
                        killed = False
                        async for chunk in live.aiter_raw():
                            for m in parser.feed(chunk):
                                live_datas.append(m.data)
                            if not killed and len(live_datas) >= 5:
                                redis.kill()
                                killed = True
                    assert killed
                    # The reader that was connected gets the whole stream (served from the producer's memory).
                    assert live_datas[-1] == "[DONE]" and len(text_of(live_datas)) > 0

                    # New streams are still served, without ids (not resumable); nothing else changes.
                    new, new_msgs = await sse_post(client, chat(10, seed=1))
                    assert new.status_code == 200 and "x-eloquent-stream" not in new.headers
                    assert all(m.id is None for m in new_msgs)
                    assert text_of([m.data for m in new_msgs]) == text_of([m.data for m in first_msgs]) != ""
                    assert new_msgs[-1].data == "[DONE]"

                    # Resumes get the documented 503.
                    for last_id in (first_msgs[3].id, live_token + ":2", live_token):
                        refused = await client.post("/v1/chat/completions", headers={"last-event-id": last_id})
                        assert refused.status_code == 503, (last_id, refused.status_code, refused.text)
                        assert refused.json()["error"]["code"] == "resume_store_unavailable"

            await asyncio.wait_for(scenario(), GUARD)
    stats = engine_app.state.engine.stats()
    assert stats.running == 0 and stats.aborted == 0 and stats.failed == 0


# --- 3. The client's network vanishes for longer than the QUIC idle timeout -------------------------------------

async def test_outage_longer_than_idle_timeout_ends_both_sides_and_aborts_the_engine() -> None:
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.01))
    engine = app.state.engine
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig(keepalive=0.2),
                                   options=FrontEndOptions(idle_timeout=1.0))
    # Everything dropped both ways from 2 s after the relay starts, for far longer than the idle timeout.
    relay = await start_relay(RelayConfig(target=("127.0.0.1", srv.port), outages=(Outage(2.0, 3600.0),)))
    try:
        async def scenario() -> None:
            host, port = relay.listen_addr
            before = engine.stats()
            received: list[int] = []
            async with EloquentClient(f"https://{host}:{port}", verify=False) as client, \
                    client.stream("POST", "/v1/chat/completions", json=chat(5000, seed=3)) as s:
                with pytest.raises(ClientError) as failed:
                    async for event in s.events():
                        received.append(event.index)
            assert received, "no event before the outage: the relay schedule did not fit this machine"
            assert relay.elapsed() >= 2.0
            assert "Idle timeout" in str(failed.value)  # "connection closed (code 0x..: Idle timeout)"
            assert not isinstance(failed.value, StreamFailed)  # a transport failure, not an in-band error
            await wait_until(lambda: srv.connections == 0, "the server did not close the connection")
            await wait_until(lambda: engine.stats().running == 0, "the engine request is still running")
            after = engine.stats()
            assert after.aborted == before.aborted + 1
            assert after.completed == before.completed and after.failed == before.failed
            assert relay.stats.downstream.outage_dropped > 0

        await asyncio.wait_for(scenario(), GUARD)
    finally:
        await relay.close()
        await srv.close()


# --- 4. The server restarts while clients hold resume tokens ----------------------------------------------------

async def test_restart_with_memory_store_gives_stream_not_found() -> None:
    port = free_port()
    with UvicornThread(EloquentMiddleware(create_engine_app(EngineConfig(ttft=0.0, tpot=0.001))),
                       port=port) as first:
        async with httpx.AsyncClient(base_url=first.url, timeout=GUARD) as client:
            response, messages = await asyncio.wait_for(sse_post(client, chat(10, seed=4)), GUARD)
            held = messages[2].id
            assert (await client.post("/v1/chat/completions", headers={"last-event-id": held})).status_code == 200
    # Same address, new process state: the memory store is gone.
    with UvicornThread(EloquentMiddleware(create_engine_app(EngineConfig(ttft=0.0, tpot=0.001))),
                       port=port) as second:
        async with httpx.AsyncClient(base_url=second.url, timeout=GUARD) as client:
            for last_id in (held, response.headers["x-eloquent-stream"]):
                gone = await asyncio.wait_for(
                    client.post("/v1/chat/completions", headers={"last-event-id": last_id}), GUARD)
                assert gone.status_code == 404 and gone.json()["error"]["code"] == "stream_not_found"
            # The resuming client library turns it into a typed error, not a retry loop.
            from eloquent_client.sse import SSEStreamError, stream_sse

            with pytest.raises(SSEStreamError) as refused:
                async for _ in stream_sse(client, "POST", second.url + "/v1/chat/completions",
                                          headers={"last-event-id": held}):
                    pass
            assert refused.value.status == 404


@contextlib.contextmanager
def redis_replica(url: str, **extra: str) -> Iterator[UvicornProcess]:
    env = {"ELOQUENT_RESUME_STORE": url, "ELOQUENT_KEEPALIVE": "1", "ELOQUENT_RESUME_GRACE": "30", **extra}
    with UvicornProcess("tests.support.servers:engine_behind_middleware", env=env, factory=True) as proc:
        yield proc


async def test_restart_with_redis_store_resumes_on_the_new_instance() -> None:
    with RedisProcess() as redis:
        with redis_replica(redis.url) as first:
            async with httpx.AsyncClient(base_url=first.url, timeout=GUARD) as client:
                response, messages = await asyncio.wait_for(sse_post(client, chat(30, seed=5)), GUARD)
                token = response.headers["x-eloquent-stream"]
                stats = (await client.get("/v1/engine/stats")).json()
                assert stats["completed"] == 1
        with redis_replica(redis.url) as second:
            async with httpx.AsyncClient(base_url=second.url, timeout=GUARD) as client:
                resumed = await asyncio.wait_for(
                    client.post("/v1/chat/completions", headers={"last-event-id": messages[9].id}), GUARD)
                assert resumed.status_code == 200
                replay = SSEParser().feed(resumed.content)
                assert [(m.id, m.data) for m in replay] == [(m.id, m.data) for m in messages[10:]]
                whole = await client.post("/v1/chat/completions", headers={"last-event-id": token})
                assert [m.data for m in SSEParser().feed(whole.content)] == [m.data for m in messages]
                # The engine of the new instance ran nothing: the events came from Redis.
                stats = (await client.get("/v1/engine/stats")).json()
                assert stats["completed"] == 0 and stats["running"] == 0


async def test_producer_replica_crash_ends_a_resume_on_another_replica_instead_of_hanging() -> None:
    """A replica dies mid-stream (SIGKILL, no end marker written): a resume on another replica must not wait for
    the keys to expire (minutes); the producer's heartbeat lapses and, with migration off (with it on the answer
    is continued there: tests/transports/test_migration.py), the body ends uncompleted."""
    from eloquent_plugins.transports.resume.redis_store import HEARTBEAT_TTL, RedisStore

    async def scenario() -> None:
        with RedisProcess() as redis:
            with redis_replica(redis.url) as first:
                async with httpx.AsyncClient(base_url=first.url, timeout=60) as client:
                    async with client.stream("POST", "/v1/chat/completions",
                                             json=chat(3000, seed=7, tpot=0.01)) as response:
                        token = response.headers["x-eloquent-stream"]
                        parser, got = SSEParser(), []
                        async for chunk in response.aiter_raw():
                            got += parser.feed(chunk)
                            if len(got) > 20:
                                break
                # Killed once Redis holds what the client has: the resume starts, then the heartbeat lapses. (Killed
                # earlier, the resume names an event Redis never got and is refused with 410 before any body:
                # RedisSource._await_sent, tests/transports/sse/test_sse_edges.py. Under load the mirror can be that far behind.)
                store = RedisStore(redis.url)
                try:
                    deadline = time.monotonic() + 10
                    while len(await store.redis.xrange(store.key("s", token))) < len(got):
                        assert time.monotonic() < deadline, "the mirror did not copy the events the client holds"
                        await asyncio.sleep(0.01)
                finally:
                    await store.aclose()
                first.proc.kill()
                first.proc.wait()
            with redis_replica(redis.url, ELOQUENT_MIGRATE="off") as second:
                async with httpx.AsyncClient(base_url=second.url, timeout=httpx.Timeout(10, read=60)) as client:
                    async with client.stream("POST", "/v1/chat/completions",
                                             headers={"last-event-id": got[-1].id}) as response:
                        assert response.status_code == 200
                        with pytest.raises(httpx.RemoteProtocolError):  # cut, never passed off as complete
                            async for _chunk in response.aiter_raw():
                                pass

    await asyncio.wait_for(scenario(), GUARD + 4 * HEARTBEAT_TTL)
