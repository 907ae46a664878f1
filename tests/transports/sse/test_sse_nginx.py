"""Through a real nginx with ``proxy_read_timeout 3s``: an engine silent for 10 s before its first token and
between two tokens kills the bare stream, while with the middleware (keep-alive 1 s) every event arrives."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.core.sse_reader import SSEParser
from tests.support.servers import UvicornThread, nginx

BODY = {"messages": [{"role": "user", "content": "slow"}], "stream": True, "max_tokens": 6, "seed": 3,
        "eloquent_engine": {"ttft": 10, "tpot": 0.01, "pauses": {"3": 10}}}


@pytest.fixture(scope="module")
def proxied():
    engine = create_engine_app(EngineConfig())
    wrapped = EloquentMiddleware(engine, StreamConfig(keepalive=1.0))

    async def dispatch(scope, receive, send):
        bare = any(k == b"x-variant" and v == b"bare" for k, v in scope.get("headers", ()))
        await (engine if bare else wrapped)(scope, receive, send)

    with UvicornThread(dispatch) as app, nginx(app.port, "proxy_read_timeout 3s;") as url:
        yield url, engine.state.engine


async def read_all(url: str, variant: str) -> tuple[list[str], BaseException | None]:
    datas: list[str] = []
    try:
        async with httpx.AsyncClient(timeout=60) as client:
            async with client.stream("POST", url + "/v1/chat/completions", json=BODY,
                                     headers={"x-variant": variant}) as response:
                if response.status_code != 200:
                    return datas, RuntimeError(f"HTTP {response.status_code}")
                parser = SSEParser()
                async for chunk in response.aiter_bytes():
                    datas.extend(m.data for m in parser.feed(chunk))
    except httpx.HTTPError as exc:
        return datas, exc
    return datas, None


async def test_keepalive_carries_silent_engine_through_nginx(proxied):
    url, engine = proxied
    (bare, bare_error), (kept, kept_error) = await asyncio.gather(read_all(url, "bare"), read_all(url, "wrapped"))
    assert "[DONE]" not in bare and (bare_error is not None or len(bare) < 3), "nginx should have cut the bare stream"
    assert kept_error is None and kept[-1] == "[DONE]"
    chunks = [json.loads(d) for d in kept[:-1]]
    text = "".join((c["choices"][0].get("delta") or {}).get("content") or "" for c in chunks if c["choices"])
    assert len(text.split()) >= 5
    assert engine.completed >= 1
