"""EloquentMiddleware against the built-in engine on a real uvicorn: pass-through, keep-alive, ids and resume,
abort, in-band errors, metrics, hooks, and the openai SDK / httpx-sse reading through it unchanged."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from httpx_sse import aconnect_sse
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route

from eloquent_client.sse import SSEStreamError, stream_sse
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.core.hooks.specs import hookimpl
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.core.sse_reader import SSEParser
from tests.support.servers import UvicornThread
from tests.support.streams import chat_maker, text_of, wait_until


class Recorder:
    """A plugin that records the stream hooks."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    @hookimpl
    def eloquent_stream_start(self, stream: Any) -> None:
        self.calls.append(("start", stream.stream_id))

    @hookimpl
    def eloquent_stream_event(self, stream: Any, event: Any) -> None:
        self.calls.append(("event", event.index))

    @hookimpl
    def eloquent_stream_error(self, stream: Any, error: BaseException) -> None:
        self.calls.append(("error", type(error).__name__))

    @hookimpl
    def eloquent_stream_end(self, stream: Any, reason: str) -> None:
        self.calls.append(("end", reason))


def failing_app() -> Starlette:
    """TGI and Triton style routes that send one event and then fail."""

    def route(payload: bytes):
        async def endpoint(request: Any) -> StreamingResponse:
            async def body():
                yield b"data: " + payload + b"\n\n"
                await asyncio.sleep(0.01)
                raise RuntimeError("model crashed")
            return StreamingResponse(body(), media_type="text/event-stream")
        return endpoint

    tgi = b'{"index":1,"token":{"id":5,"text":"Hi","logprob":0.0,"special":false},"generated_text":null}'
    return Starlette(routes=[Route("/generate_stream", route(tgi), methods=["POST"]),
                             Route("/v2/models/m/generate_stream", route(b'{"text_output":"Hi"}'), methods=["POST"])])


class Dispatch:
    """One server for the module; the ``x-variant`` header picks the middleware configuration."""

    def __init__(self, variants: dict[str, Any]) -> None:
        self.variants = variants

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        name = "default"
        for key, value in scope.get("headers", ()):
            if key == b"x-variant":
                name = value.decode()
        await self.variants[name](scope, receive, send)


@pytest.fixture(scope="module")
def server():
    engine = create_engine_app(EngineConfig(ttft=0.0, tpot=0.002))
    raising = create_engine_app(EngineConfig(ttft=0.0, tpot=0.002, raise_errors=True))
    recorder = Recorder()
    base = StreamConfig(keepalive=0.2, resume_grace=0.5, send_timeout=5)
    variants = {
        "bare": engine,
        "default": EloquentMiddleware(engine, base),
        "noresume": EloquentMiddleware(engine, base.replace(resume=False)),
        "raise": EloquentMiddleware(raising, base),
        "gateway": EloquentMiddleware(failing_app(), base),
        "hooks": EloquentMiddleware(engine, base, plugin_manager=create_plugin_manager(plugins=[recorder])),
    }
    with UvicornThread(Dispatch(variants)) as srv:
        srv.engine = engine.state.engine
        srv.raising = raising.state.engine
        srv.recorder = recorder
        srv.variants = variants
        yield srv


@pytest.fixture
async def client(server):
    async with httpx.AsyncClient(base_url=server.url, timeout=20) as c:
        yield c


chat = chat_maker(max_tokens=20, seed=1, prompt="tell me {seed}")


async def raw_stream(client: httpx.AsyncClient, body: Any, variant: str = "default", **headers: str):
    async with client.stream("POST", "/v1/chat/completions", json=body,
                             headers={"x-variant": variant, **headers}) as response:
        chunks = [chunk async for chunk in response.aiter_raw()]
    return response, chunks


async def test_non_sse_responses_pass_through_byte_for_byte(client):
    for method, path, body in (("GET", "/v1/models", None), ("POST", "/v1/chat/completions", {"stream": True}),
                               ("POST", "/v1/chat/completions", {**chat(), "stream": False}), ("GET", "/nope", None)):
        bare = await client.request(method, path, json=body, headers={"x-variant": "bare"})
        wrapped = await client.request(method, path, json=body, headers={"x-variant": "default"})
        assert wrapped.status_code == bare.status_code
        assert wrapped.headers.get("content-type") == bare.headers.get("content-type")
        if body is None or body.get("stream") is True:  # the non-streamed completion has a random id
            assert wrapped.content == bare.content
        assert "x-eloquent-stream" not in wrapped.headers
    assert (await client.post("/v1/chat/completions", json={"stream": True})).status_code == 400


async def test_datagram_requests_are_not_touched(client):
    response, chunks = await raw_stream(client, chat(5), **{"eloquent-transport": "datagram"})
    raw = b"".join(chunks)
    assert b"id: " not in raw and "x-eloquent-stream" not in response.headers
    assert raw.endswith(b"data: [DONE]\n\n")


async def test_stream_gets_ids_headers_and_same_content(client):
    response, chunks = await raw_stream(client, chat(30))
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    assert "connection" not in response.headers and "content-length" not in response.headers
    token = response.headers["x-eloquent-stream"]
    assert len(token) >= 22
    messages = SSEParser().feed(b"".join(chunks))
    assert [m.id for m in messages] == [f"{token}:{i}" for i in range(len(messages))]
    _, bare_chunks = await raw_stream(client, chat(30), variant="bare")
    bare = SSEParser().feed(b"".join(bare_chunks))
    assert text_of([m.data for m in messages]) == text_of([m.data for m in bare])
    assert len(messages) == len(bare) and messages[-1].data == "[DONE]"


async def test_keepalive_starts_before_the_first_token_and_fills_silences(client):
    response, chunks = await raw_stream(client, chat(6, ttft=0.7, pauses={"3": 0.7}))
    assert response.status_code == 200
    body = b"".join(chunks)
    first_data = body.index(b"data: ")
    assert b": keep-alive\n" in body[:first_data], "no keep-alive before the first token"
    after_token_2 = body.index(b"data: ", body.index(b":2\n"))
    assert b": keep-alive" in body[after_token_2:], "no keep-alive in the pause between tokens"
    assert text_of([m.data for m in SSEParser().feed(body)])


async def test_noresume_stream_is_the_bare_bytes_plus_keepalives(client):
    _, chunks = await raw_stream(client, chat(10, seed=3), variant="noresume")
    _, bare = await raw_stream(client, chat(10, seed=3), variant="bare")
    strip = lambda raw: [m.data for m in SSEParser().feed(raw)]  # noqa: E731
    assert text_of(strip(b"".join(chunks))) == text_of(strip(b"".join(bare)))
    assert b"id: " not in b"".join(chunks)


async def test_resume_mid_generation_delivers_the_rest_exactly_once(server, client):
    before = server.engine.stats()
    body = chat(60, seed=7, tpot=0.01)
    got: list[str] = []
    last_id = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        token = response.headers["x-eloquent-stream"]
        parser = SSEParser()
        async for chunk in response.aiter_raw():
            for message in parser.feed(chunk):
                got.append(message.data)
                last_id = message.id
            if len(got) >= 10:
                break  # drop the connection mid-generation
    assert last_id is not None and last_id.startswith(token + ":")
    _, chunks = await raw_stream(client, body, **{"last-event-id": last_id})
    rest = SSEParser().feed(b"".join(chunks))
    assert int(rest[0].id.rpartition(":")[2]) == int(last_id.rpartition(":")[2]) + 1
    _, bare = await raw_stream(client, body, variant="bare")
    full = [m.data for m in SSEParser().feed(b"".join(bare))]
    assert text_of(got + [m.data for m in rest]) == text_of(full)
    assert len(got) + len(rest) == len(full)
    after = server.engine.stats()
    assert after.completed - before.completed == 2  # the resumed stream and the bare one
    assert after.aborted == before.aborted


async def test_resume_of_finished_stream_replays_to_the_end_then_204(client):
    response, chunks = await raw_stream(client, chat(8, seed=9))
    token = response.headers["x-eloquent-stream"]
    messages = SSEParser().feed(b"".join(chunks))
    again_response, again = await raw_stream(client, {}, **{"last-event-id": f"{token}:2"})
    assert again_response.status_code == 200
    assert [m.data for m in SSEParser().feed(b"".join(again))] == [m.data for m in messages[3:]]
    # From the start with the bare token, and the query-parameter form for POST/fetch clients.
    _, from_start = await raw_stream(client, {}, **{"last-event-id": token})
    assert [m.data for m in SSEParser().feed(b"".join(from_start))] == [m.data for m in messages]
    query = await client.post(f"/v1/chat/completions?last_event_id={token}:{len(messages) - 2}")
    assert SSEParser().feed(query.content)[0].data == "[DONE]"
    done = await client.get("/v1/chat/completions", headers={"last-event-id": messages[-1].id})
    assert done.status_code == 204


async def test_resume_errors_are_clear(client):
    unknown = await client.post("/v1/chat/completions", headers={"last-event-id": "A" * 22 + ":3"})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "stream_not_found"
    bad = await client.post("/v1/chat/completions", headers={"last-event-id": "not an id"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_last_event_id"
    response, chunks = await raw_stream(client, chat(4), authorization="Bearer alice")
    token = response.headers["x-eloquent-stream"]
    other = await client.post("/v1/chat/completions", headers={"last-event-id": f"{token}:0",
                                                               "authorization": "Bearer mallory"})
    assert other.status_code == 403 and other.json()["error"]["code"] == "stream_forbidden"
    future = await client.post("/v1/chat/completions", headers={"last-event-id": f"{token}:999",
                                                                "authorization": "Bearer alice"})
    assert future.status_code == 400
    same = await client.post("/v1/chat/completions", headers={"last-event-id": f"{token}:0",
                                                              "authorization": "Bearer alice"})
    assert same.status_code == 200 and SSEParser().feed(same.content)[-1].data == "[DONE]"
    with pytest.raises(SSEStreamError) as info:
        async for _ in stream_sse(client, "POST", "/v1/chat/completions",
                                  headers={"last-event-id": "B" * 22 + ":1"}):
            pass
    assert info.value.status == 404


async def _read_then_drop(client: httpx.AsyncClient, body: Any, variant: str, events: int) -> str | None:
    async with client.stream("POST", "/v1/chat/completions", json=body, headers={"x-variant": variant}) as resp:
        parser = SSEParser()
        seen = []
        async for chunk in resp.aiter_raw():
            seen.extend(parser.feed(chunk))
            if len(seen) >= events:
                break
    return seen[-1].id


async def test_disconnect_without_resume_aborts_the_engine_request(server, client):
    before = server.engine.aborted
    await _read_then_drop(client, chat(2000, seed=11, tpot=0.01), "noresume", 3)
    await wait_until(lambda: server.engine.aborted == before + 1)


async def test_disconnect_with_resume_aborts_after_the_grace_period(server, client):
    before = server.engine.stats()
    last_id = await _read_then_drop(client, chat(2000, seed=12, tpot=0.01), "default", 3)
    await asyncio.sleep(0.1)
    assert server.engine.aborted == before.aborted  # still generating for a possible resume
    await wait_until(lambda: server.engine.aborted == before.aborted + 1)
    late = await client.post("/v1/chat/completions", headers={"last-event-id": last_id})
    assert late.status_code == 410 and late.json()["error"]["code"] == "stream_aborted"


async def test_engine_error_after_200_is_an_in_band_openai_error(server, client):
    body = chat(20, seed=5, fail_after=4)
    response, chunks = await raw_stream(client, body, variant="raise")
    assert response.status_code == 200
    messages = SSEParser().feed(b"".join(chunks))
    error = json.loads(messages[-2].data)["error"]
    assert "fail_after" in error["message"] and messages[-1].data == "[DONE]"
    # The replay store keeps it: a resume replays the error too.
    token = response.headers["x-eloquent-stream"]
    _, again = await raw_stream(client, {}, variant="raise", **{"last-event-id": f"{token}:{len(messages) - 3}"})
    assert [m.data for m in SSEParser().feed(b"".join(again))] == [m.data for m in messages[-2:]]
    import openai

    sdk = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", default_headers={"x-variant": "raise"})
    with pytest.raises(openai.APIError):
        async for _ in await sdk.chat.completions.create(model="eloquent-builtin", messages=body["messages"],
                                                         stream=True, extra_body={"eloquent_engine": {
                                                             "fail_after": 4}}):
            pass
    await sdk.close()


async def test_engine_error_in_tgi_and_triton_formats(client):
    tgi = await client.post("/generate_stream", json={}, headers={"x-variant": "gateway"})
    messages = SSEParser().feed(tgi.content)
    assert json.loads(messages[-1].data) == {"error": "model crashed", "error_type": "RuntimeError"}
    triton = await client.post("/v2/models/m/generate_stream", json={}, headers={"x-variant": "gateway"})
    messages = SSEParser().feed(triton.content)
    assert [json.loads(m.data) for m in messages] == [{"text_output": "Hi"}, {"error": "model crashed"}]


async def test_metrics_route_counts_streams(client):
    await raw_stream(client, chat(5))
    metrics = await client.get("/metrics")
    assert metrics.status_code == 200
    text = metrics.text
    assert "eloquent_sse_streams_started_total" in text
    assert "eloquent_sse_time_to_first_token_seconds_bucket" in text
    started = next(line for line in text.splitlines() if line.startswith("eloquent_sse_streams_started_total"))
    assert float(started.split()[-1]) >= 1


async def test_hooks_see_start_events_end(server, client):
    _, chunks = await raw_stream(client, chat(5, seed=2), variant="hooks")
    n = len(SSEParser().feed(b"".join(chunks)))
    await wait_until(lambda: any(c[0] == "end" for c in server.recorder.calls))
    calls = server.recorder.calls
    assert calls[0][0] == "start" and calls[-1] == ("end", "complete")
    assert [c[1] for c in calls if c[0] == "event"] == list(range(n))


async def test_openai_sdk_and_httpx_sse_read_it_unchanged(server, client):
    import openai

    texts = {}
    for variant in ("bare", "default"):
        sdk = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="x", default_headers={"x-variant": variant})
        parts = []
        async for chunk in await sdk.chat.completions.create(model="eloquent-builtin", stream=True, seed=4,
                                                             max_tokens=40, messages=chat()["messages"],
                                                             extra_body={"eloquent_engine": {"pauses": {"5": 0.5}}}):
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
        await sdk.close()
        async with aconnect_sse(client, "POST", "/v1/chat/completions", json=chat(40, seed=4),
                                headers={"x-variant": variant}) as source:
            datas = [sse.data async for sse in source.aiter_sse()]
        texts[variant] = ("".join(parts), text_of(datas), datas[-1])
    assert texts["default"] == texts["bare"]
    assert texts["default"][0]


async def test_one_correlation_id_in_the_logs_of_every_connection(client, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="eloquent_plugins.transports.sse")
    body = chat(40, seed=21, tpot=0.01)
    last_id = await _read_then_drop(client, body, "default", 5)
    _, chunks = await raw_stream(client, body, **{"last-event-id": last_id})
    assert SSEParser().feed(b"".join(chunks))[-1].data == "[DONE]"
    await wait_until(lambda: any("ended" in r.getMessage() and "first connection" in r.getMessage()
                                 for r in caplog.records))
    lines = [r.getMessage() for r in caplog.records if r.name == "eloquent_plugins.transports.sse"]
    started = next(line for line in lines if " started: " in line)
    stream_id = started.split()[0]  # "stream=s-..."
    assert any(stream_id in line and "resumed after event" in line for line in lines)
    assert any(stream_id in line and "ended: complete" in line for line in lines)
