"""200 streams, each cut 5 times at random points by a TCP proxy: every client ends with exactly the text of the
uncut stream (no event lost or repeated), and no engine request is repeated or aborted."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from eloquent_client.sse import stream_sse
from eloquent_plugins.core.config import StreamConfig
from eloquent_plugins.engine import Engine, EngineConfig, create_engine_app
from eloquent_plugins.engine.requests import parse_request
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.cutproxy import CutPlan, CutProxy
from tests.support.servers import UvicornThread

STREAMS = 200
CUTS = 5
TOKENS = 120


def body(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"story {i}"}], "stream": True, "max_tokens": TOKENS,
            "seed": i, "eloquent_engine": {"ttft": 0, "tpot": 0.003}}


def text(datas: list[str]) -> str:
    out = []
    for data in datas:
        if data != "[DONE]":
            for choice in json.loads(data)["choices"]:
                out.append((choice.get("delta") or {}).get("content") or "")
    return "".join(out)


def expected_texts(engine: Engine) -> dict[int, str]:
    """What each uncut stream says (the engine is deterministic)."""
    out = {}
    for i in range(STREAMS):
        request = parse_request(body(i), chat=True, config=engine.config)
        out[i] = "".join(t.text for t in engine.tokens_for(request.prompt, max_tokens=TOKENS, seed=i))
    return out


async def run_chaos(base_url: str, plan: CutPlan, expected: dict[int, str]) -> None:
    limits = httpx.Limits(max_keepalive_connections=0, max_connections=1000)
    async with httpx.AsyncClient(base_url=base_url, timeout=60, limits=limits) as client:

        async def one(i: int) -> tuple[int, list[str], list[str]]:
            datas, ids = [], []
            async for message in stream_sse(client, "POST", "/v1/chat/completions", json=body(i),
                                            headers={"x-test-stream": str(i)}, backoff=0.02, max_retries=8):
                datas.append(message.data)
                ids.append(message.id)
            return i, datas, ids

        results = await asyncio.gather(*(one(i) for i in range(STREAMS)))
    for i, datas, ids in results:
        indices = [int(x.rpartition(":")[2]) for x in ids]
        assert indices == list(range(len(indices))), f"stream {i}: events lost or repeated"
        assert datas[-1] == "[DONE]"
        assert text(datas) == expected[i], f"stream {i}: text differs from the uncut stream"
    assert all(plan.done_cuts.get(str(i), 0) == CUTS for i in range(STREAMS)), "some stream was not cut 5 times"


@pytest.fixture(scope="module")
def replica():
    engine = create_engine_app(EngineConfig())
    app = EloquentMiddleware(engine, StreamConfig(keepalive=1.0, resume_grace=30.0))
    with UvicornThread(app, backlog=2048) as srv:
        srv.engine = engine.state.engine
        yield srv


async def test_200_streams_cut_5_times_each_arrive_exactly_once(replica):
    plan = CutPlan(cuts={str(i): CUTS for i in range(STREAMS)}, cut_range=(1, 2500), seed=5)
    with CutProxy([replica.port], plan) as proxy:
        await run_chaos(proxy.url, plan, expected_texts(replica.engine))
    stats = replica.engine.stats()
    assert (stats.completed, stats.aborted, stats.running) == (STREAMS, 0, 0)  # no request repeated or aborted
