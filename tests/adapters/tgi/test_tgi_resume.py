"""The TGI gateway behind ``EloquentMiddleware`` over plain HTTP/1.1 SSE: keep-alive, event ids, resume.

The middleware is the piece that adds these; the gateway's part is to start at once and hand it one upstream
event per SSE message. Clients that know nothing of Eloquent (``text-generation``, the openai SDK) must read the
same as from TGI directly: ``id:`` lines and comments are invisible to them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import text_generation
from eloquent_tgi.gateway import create_tgi_gateway

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.core.sse_reader import SSEMessage, SSEParser
from tests.support.tgi_server import TGIServerState, create_tgi_server, run_in_thread

# A long grace: a client that drops and comes back must find its stream still generating, however slow CI is.
CONFIG = StreamConfig(keepalive=0.05, resume_grace=30.0, stream_transport="sse")


@dataclass(frozen=True)
class Servers:
    upstream: str
    front: str
    state: TGIServerState


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    app = create_tgi_server()
    with run_in_thread(app) as upstream, \
            run_in_thread(EloquentMiddleware(create_tgi_gateway(upstream, CONFIG), CONFIG)) as front:
        yield Servers(upstream, front, app.state.tgi)


def data_messages(raw: bytes) -> list[SSEMessage]:
    return SSEParser().feed(raw)


def payloads(raw: bytes) -> list[Any]:
    return [json.loads(m.data) if m.data != "[DONE]" else m.data for m in data_messages(raw)]


def test_events_get_ids_and_payloads_stay_the_same(servers: Servers) -> None:
    body = {"inputs": "Test request", "parameters": {"max_new_tokens": 30, "details": True}}
    direct = httpx.post(servers.upstream + "/generate_stream", json=body, timeout=30)
    front = httpx.post(servers.front + "/generate_stream", json=body, timeout=30)
    assert front.status_code == 200 and front.headers["content-type"].startswith("text/event-stream")
    token = front.headers["x-eloquent-stream"]
    messages = data_messages(front.content)
    assert [m.data for m in messages] == [m.data for m in data_messages(direct.content)]
    assert [m.id for m in messages] == [f"{token}:{i}" for i in range(len(messages))]


def test_keepalive_while_tgi_is_silent(servers: Servers) -> None:
    with httpx.stream("POST", servers.front + "/generate_stream", timeout=30,
                      json={"inputs": "x !hold=quiet", "parameters": {"max_new_tokens": 2}}) as response:
        chunks = response.iter_raw()
        first = next(chunks)  # the upstream sends nothing until released: this can only be a keep-alive
        assert first.startswith(b":")
        servers.state.release("quiet")
        rest = b"".join(chunks)
    assert [p["index"] for p in payloads(rest)] == [1, 2]


def test_resume_after_a_disconnect_needs_no_second_tgi_request(servers: Servers) -> None:
    state = servers.state
    body = {"inputs": "resume me !hold=r1 !holdat=3", "parameters": {"max_new_tokens": 6, "details": True}}
    started = state.started
    first: list[SSEMessage] = []
    with httpx.stream("POST", servers.front + "/generate_stream", json=body, timeout=30) as response:
        parser = SSEParser()
        for chunk in response.iter_raw():
            first += parser.feed(chunk)
            if len(first) >= 3:
                break
    assert len(first) == 3 and first[-1].id is not None
    # the client is gone; TGI is still held at token 4 and must not be asked again
    with httpx.stream("POST", servers.front + "/generate_stream", json=body, timeout=30,
                      headers={"last-event-id": first[-1].id}) as response:
        assert response.status_code == 200
        state.release("r1")
        rest = data_messages(response.read())
    assert state.started == started + 1
    direct = httpx.post(servers.upstream + "/generate_stream", json=body, timeout=30)
    assert [m.data for m in first + rest] == [m.data for m in data_messages(direct.content)]
    assert json.loads(rest[-1].data)["details"]["generated_tokens"] == 6


def test_resume_of_a_finished_stream_replays_the_tail(servers: Servers) -> None:
    body = {"inputs": "Test request", "parameters": {"max_new_tokens": 4}}
    whole = data_messages(httpx.post(servers.front + "/generate_stream", json=body, timeout=30).content)
    again = httpx.post(servers.front + "/generate_stream", json=body, timeout=30,
                       headers={"last-event-id": whole[1].id or ""})
    assert [m.data for m in data_messages(again.content)] == [m.data for m in whole[2:]]


def test_error_events_pass_through_with_ids(servers: Servers) -> None:
    body = {"inputs": "x !error=overloaded !after=1", "parameters": {}}
    messages = data_messages(httpx.post(servers.front + "/generate_stream", json=body, timeout=30).content)
    assert json.loads(messages[-1].data) == {"error": "Model is overloaded", "error_type": "overloaded"}
    assert all(m.id for m in messages)


async def test_text_generation_client_reads_the_same_through_the_middleware(servers: Servers) -> None:
    runs = []
    for url in (servers.upstream, servers.front):
        client = text_generation.AsyncClient(url, timeout=60)
        runs.append([r.model_dump() async for r in client.generate_stream("Test request", max_new_tokens=12)])
    assert runs[0] == runs[1] and len(runs[1]) == 11


async def test_openai_sdk_reads_the_same_through_the_middleware(servers: Servers) -> None:
    runs = []
    for url in (servers.upstream, servers.front):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0)
        stream = await client.chat.completions.create(  # type: ignore[call-overload]
            model="tgi", messages=[{"role": "user", "content": "hi"}], stream=True)
        runs.append([c.model_dump() async for c in stream])
        await client.close()
    assert runs[0] == runs[1]


async def test_stream_sse_client_reads_every_event_once(servers: Servers) -> None:
    from eloquent_client.sse import stream_sse

    body = {"inputs": "Test request", "parameters": {"max_new_tokens": 8, "details": True}}
    async with httpx.AsyncClient(timeout=30) as client:
        got = [m.data async for m in stream_sse(client, "POST", servers.front + "/generate_stream", json=body)]
    direct = await asyncio.to_thread(httpx.post, servers.upstream + "/generate_stream", json=body, timeout=30)
    assert got == [m.data for m in data_messages(direct.content)]


def test_non_stream_routes_pass_through(servers: Servers) -> None:
    for method, path, body in (("GET", "/info", None), ("GET", "/health", None),
                               ("POST", "/generate", {"inputs": "x", "parameters": {"max_new_tokens": 2}})):
        direct, front = (httpx.request(method, url + path, json=body, timeout=30)
                         for url in (servers.upstream, servers.front))
        assert (front.status_code, front.content) == (direct.status_code, direct.content)
