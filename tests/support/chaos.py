"""The resume chaos run shared by the single-replica and the two-replica tests: 200 streams through a cutting
proxy, each checked against the text of the uncut stream."""

from __future__ import annotations

import asyncio

import httpx

from eloquent_client.sse import stream_sse
from eloquent_plugins.engine import Engine
from eloquent_plugins.engine.requests import parse_request
from tests.support.cutproxy import CutPlan
from tests.support.streams import text_of

STREAMS = 200
CUTS = 5
TOKENS = 120


def body(i: int) -> dict:
    return {"messages": [{"role": "user", "content": f"story {i}"}], "stream": True, "max_tokens": TOKENS,
            "seed": i, "eloquent_engine": {"ttft": 0, "tpot": 0.003}}


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
        assert text_of(datas) == expected[i], f"stream {i}: text differs from the uncut stream"
    assert all(plan.done_cuts.get(str(i), 0) == CUTS for i in range(STREAMS)), "some stream was not cut 5 times"
