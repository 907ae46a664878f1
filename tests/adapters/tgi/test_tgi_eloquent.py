"""The TGI gateway behind ``EloquentMiddleware`` on the HTTP/3 front end: Eloquent datagrams and HTTP/3 SSE carry
exactly TGI's events, a client that leaves still frees the TGI request, and the same holds through the UDP relay.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from eloquent_client import EloquentClient, StreamFailed
from eloquent_tgi.gateway import create_tgi_gateway

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.core.sse_reader import SSEParser
from tests.support.tgi_server import TGIServerState, create_tgi_server, run_http3_in_thread, run_in_thread

# resume_grace 0: a client that leaves aborts the TGI request at once (what the disconnect test checks).
CONFIG = StreamConfig(keepalive=0.05, resume_grace=0.0)
STREAM = {"inputs": "Test request", "parameters": {"max_new_tokens": 30, "details": True}}
CHAT = {"model": "tgi", "messages": [{"role": "user", "content": "hi"}], "stream": True,
        "stream_options": {"include_usage": True}}


@dataclass(frozen=True)
class Servers:
    upstream: str
    h3_port: int
    state: TGIServerState

    @property
    def h3_url(self) -> str:
        return f"https://127.0.0.1:{self.h3_port}"


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    app = create_tgi_server()
    with run_in_thread(app) as upstream:
        def front() -> Any:
            return EloquentMiddleware(create_tgi_gateway(upstream, CONFIG), CONFIG)

        with run_http3_in_thread(front, CONFIG) as port:
            yield Servers(upstream, port, app.state.tgi)


def direct_data(servers: Servers, path: str, body: dict[str, Any]) -> list[str]:
    response = httpx.post(servers.upstream + path, json=body, timeout=30)
    return [m.data for m in SSEParser().feed(response.content)]


@pytest.fixture
async def client(servers: Servers, request: pytest.FixtureRequest) -> AsyncIterator[EloquentClient]:
    transport = getattr(request, "param", "eloquent")
    async with EloquentClient(servers.h3_url, transport=transport, verify=False, timeout=30) as c:
        yield c


@pytest.mark.parametrize("client", ["eloquent", "h3-stream"], indirect=True)
@pytest.mark.parametrize(("path", "body"), [("/generate_stream", STREAM),
                                            ("/", {**STREAM, "stream": True}),
                                            ("/v1/chat/completions", CHAT)])
async def test_http3_carries_tgis_events_unchanged(servers: Servers, client: EloquentClient, path: str,
                                                  body: dict[str, Any]) -> None:
    async with client.stream("POST", path, json=body) as s:
        got = [e.data async for e in s.events()]
        assert s.delivery == client.transport
    assert got == await asyncio.to_thread(direct_data, servers, path, body)


async def test_text_of_a_tgi_stream_over_datagrams(servers: Servers, client: EloquentClient) -> None:
    async with client.stream("POST", "/generate_stream", json=STREAM) as s:
        assert await s.text() == " for /api/v1/projects/1"


@pytest.mark.parametrize("error_type", ["validation", "generation", "overloaded", "incomplete_generation",
                                        "tokenizer"])
async def test_tgi_error_events_over_datagrams(servers: Servers, client: EloquentClient, error_type: str) -> None:
    body = {"inputs": f"x !error={error_type} !after=2", "parameters": {}}
    async with client.stream("POST", "/generate_stream", json=body) as s:
        with pytest.raises(StreamFailed):
            async for _ in s.text_deltas():
                pass
        got = [e.data for e in s.rendered]
    assert got == await asyncio.to_thread(direct_data, servers, "/generate_stream", body)
    assert json.loads(got[-1])["error_type"] == error_type


async def test_non_stream_routes_over_http3(servers: Servers, client: EloquentClient) -> None:
    for method, path, body in (("GET", "/info", None), ("GET", "/health", None),
                               ("POST", "/generate", {"inputs": "x", "parameters": {"max_new_tokens": 3}})):
        response = await client.request(method, path, json=body)
        direct = await asyncio.to_thread(httpx.request, method, servers.upstream + path, json=body, timeout=30)
        assert (response.status, response.content) == (direct.status_code, direct.content)


@pytest.mark.parametrize("client", ["eloquent", "h3-stream"], indirect=True)
async def test_leaving_an_http3_stream_frees_the_tgi_request(servers: Servers, client: EloquentClient) -> None:
    state = servers.state
    started, disconnects = state.started, state.disconnects
    body = {"inputs": f"x !loop !hold=h3-{client.transport} !holdat=2", "parameters": {"max_new_tokens": 100}}
    async with client.stream("POST", "/generate_stream", json=body) as s:
        seen = 0
        async for _ in s.events():
            seen += 1
            if seen == 2:
                break
    assert state.started == started + 1
    assert await asyncio.to_thread(state.wait_for, "disconnects", disconnects + 1)


@pytest.mark.parametrize("loss", [0.0, 0.1])
@pytest.mark.parametrize(("path", "body"), [
    ("/generate_stream", STREAM), ("/v1/chat/completions", CHAT),
    ("/generate_stream", {"inputs": "x !error=generation !after=4"}),
    ("/generate_stream", {"inputs": "paced !loop !delay=0.005", "parameters": {"max_new_tokens": 60, "details": True}}),
])
async def test_datagrams_through_the_relay(servers: Servers, loss: float, path: str, body: dict[str, Any]) -> None:
    """Through the UDP relay, lossless and with 10% of server-to-client datagrams dropped (seeded): the client
    still renders exactly the events TGI sent, in-band errors included."""
    from eloquent_plugins.sim.netem import PathConfig
    from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay

    relay = await start_relay(RelayConfig(target=("127.0.0.1", servers.h3_port),
                                          downstream=PathConfig(loss=loss), seed=8))
    try:
        port = relay.listen_addr[1]
        async with EloquentClient(f"https://127.0.0.1:{port}", verify=False, timeout=30) as c, \
                c.stream("POST", path, json=body) as s:
            got = [e.data async for e in s.events()]
            assert s.delivery == "eloquent"
    finally:
        await relay.close()
    assert got == await asyncio.to_thread(direct_data, servers, path, body)
