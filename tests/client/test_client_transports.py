"""One client API over three transports; pacing; text extraction."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import pytest
import uvicorn
from eloquent_client import (
    ClientEvent,
    EloquentClient,
    Pacer,
    Pacing,
    StreamFailed,
    text_delta,
)

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.http3.server import start_http3_server
from tests.support.servers import free_port

BODY = {"model": "eloquent-builtin", "messages": [{"role": "user", "content": "three ways"}], "stream": True,
        "max_tokens": 40}


@pytest.fixture
async def servers() -> AsyncIterator[tuple[str, int]]:
    """The same engine app over HTTP/1.1 (uvicorn, TCP) and HTTP/3 (UDP), on the same port number."""
    app = create_engine_app(EngineConfig(ttft=0.01, tpot=0.002))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.01)
    h3 = await start_http3_server(app, host="127.0.0.1", port=port, config=StreamConfig())
    yield f"https://127.0.0.1:{port}", port
    await h3.close()
    server.should_exit = True
    await task


async def test_same_text_over_every_transport(servers: tuple[str, int]) -> None:
    url, port = servers
    texts = {}
    for transport in ("eloquent", "h3-stream", "sse"):
        base = url if transport != "sse" else f"http://127.0.0.1:{port}"
        async with EloquentClient(base, transport=transport, verify=False) as client:  # type: ignore[arg-type]
            async with client.stream("POST", "/v1/chat/completions", json=BODY) as s:
                texts[transport] = await s.text()
                assert s.delivery == transport
                times = [e.rendered_at for e in s.rendered]
                assert times == sorted(times) and len(times) > 40
    assert texts["eloquent"] == texts["h3-stream"] == texts["sse"] and len(texts["sse"]) > 50


async def test_pacing_spaces_events_without_losing_any(servers: tuple[str, int]) -> None:
    url, _ = servers
    pacing = Pacing(interval=0.01, max_lag=5.0)
    async with EloquentClient(url, verify=False) as plain, EloquentClient(url, verify=False, pacing=pacing) as paced:
        async with plain.stream("POST", "/v1/chat/completions", json=BODY) as s:
            expected = await s.text()
        async with paced.stream("POST", "/v1/chat/completions", json=BODY) as s:
            assert await s.text() == expected
            times = [e.rendered_at for e in s.rendered]
    assert all(b - a >= 0.01 - 1e-9 for a, b in itertools.pairwise(times))


def test_pacer_smooths_a_burst_but_bounds_the_lag() -> None:
    pacer = Pacer(Pacing(interval=0.1, max_lag=0.25))
    burst = [pacer.release_at(1.0) for _ in range(5)]
    assert burst == pytest.approx([1.0, 1.1, 1.2, 1.25, 1.25])
    assert pacer.release_at(3.0) == 3.0  # after a quiet spell, no added delay
    with pytest.raises(ConfigError):
        Pacing(interval=-1)


def test_text_delta_reads_openai_and_tgi_chunks() -> None:
    assert text_delta('{"choices":[{"delta":{"content":"hi"}}]}') == "hi"
    assert text_delta('{"choices":[{"delta":{"role":"assistant"}}]}') is None
    assert text_delta('{"choices":[{"text":"yo","index":0}]}') == "yo"
    assert text_delta('{"index":1,"token":{"id":5,"text":" a","special":false}}') == " a"
    assert text_delta('{"index":1,"token":{"id":2,"text":"</s>","special":true}}') is None
    assert text_delta('{"model_name":"m","model_version":"1","text_output":" hi"}') == " hi"
    assert text_delta('{"error":"boom"}') is None
    assert text_delta("[DONE]") is None and text_delta("{broken") is None and text_delta("") is None
    event = ClientEvent(0, '{"error":{"message":"x"}}', 0.0)
    assert event.error == {"message": "x"} and event.text is None


async def test_in_band_error_raises_stream_failed(servers: tuple[str, int]) -> None:
    url, _ = servers
    body = {**BODY, "eloquent_engine": {"fail_after": 3}}
    async with EloquentClient(url, verify=False) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as s:
            with pytest.raises(StreamFailed):
                await s.text()


def test_client_refuses_bad_settings() -> None:
    with pytest.raises(ConfigError):
        EloquentClient("https://127.0.0.1:1", transport="carrier")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        EloquentClient("ftp://127.0.0.1:1")
    with pytest.raises(ConfigError):
        EloquentClient("https://127.0.0.1:1", scheme="triple")
