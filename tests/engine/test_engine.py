"""Tests of the built-in engine: the token generator, the OpenAI-compatible app, and a real uvicorn server."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from starlette.applications import Starlette

from eloquent_plugins.engine import (
    Engine,
    EngineConfig,
    EngineControls,
    EngineError,
    Token,
    create_engine_app,
    stable_hash,
)
from eloquent_plugins.engine.stops import StopMatcher
from eloquent_plugins.engine.vocab import build_corpus, default_corpus
from tests.support.streams import wait_until

FAST = EngineConfig(ttft=0.0, tpot=0.0)
CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSGS = [{"role": "user", "content": "Tell me a story."}]


# ---------------------------------------------------------------------------------------------- helpers


def client_for(app: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://engine")


def sse_events(body: str) -> list[str]:
    """The data payloads of an SSE body (the engine writes only ``data: ...\\n\\n`` events)."""
    assert body.endswith("\n\n")
    events = body[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


def stream_text(events: list[str], chat: bool) -> str:
    out = []
    for e in events[:-1]:
        obj = json.loads(e)
        for ch in obj.get("choices", []):
            out.append(ch["delta"].get("content") or "" if chat else ch["text"])
    return "".join(out)


async def post(client: httpx.AsyncClient, path: str, body: dict[str, Any]) -> httpx.Response:
    return await client.post(path, json=body)


@contextlib.asynccontextmanager
async def serve(app: Starlette) -> AsyncIterator[str]:
    """Run ``app`` under a real uvicorn server on a free loopback port; yields the base URL."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
    task = asyncio.create_task(server.serve())
    try:
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        assert server.started, "uvicorn did not start"
        port = server.servers[0].sockets[0].getsockname()[1]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


wait_for = functools.partial(wait_until, timeout=10.0, interval=0.01)
"""Poll until ``predicate()`` holds (a generous upper bound, not a speed assertion)."""


async def collect(engine: Engine, prompt: str = "p", **kw: Any) -> list[Token]:
    kw.setdefault("max_tokens", 20)
    kw.setdefault("seed", None)
    return [t async for t in engine.generate(prompt, **kw)]


# ---------------------------------------------------------------------------------------------- corpus & engine


def test_corpus_is_real_prose_with_stable_pieces() -> None:
    c = default_corpus()
    assert len(c) > 2500 and c.vocab_size > 1000
    text = "".join(c.texts)
    assert "Alice was beginning to get very tired" in text
    assert "It is a truth universally acknowledged" in text
    assert all(t.strip() == t.lstrip(" ") and t for t in c.texts)  # at most one leading space, never empty
    tiny = build_corpus("Hello, world. Hello again!")
    assert tiny.texts == (" Hello", ",", " world", ".", " Hello", " again", "!")
    assert tiny.sentence_starts == (0, 4)
    assert tiny.ids[0] == tiny.ids[4] and tiny.bare_texts[0] == "Hello"


def test_stable_hash_is_independent_of_pythonhashseed() -> None:
    code = "from eloquent_plugins.engine import stable_hash; print(stable_hash('prompt', 7))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert outs == {str(stable_hash("prompt", 7))}
    assert stable_hash("prompt", None) != stable_hash("prompt", 0)


async def test_generate_is_deterministic_and_well_formed() -> None:
    a = await collect(Engine(FAST), "hello", max_tokens=30, seed=1)
    b = await collect(Engine(FAST), "hello", max_tokens=30, seed=1)
    assert a == b
    assert [t.index for t in a] == list(range(30))
    assert [t.finish_reason for t in a] == [None] * 29 + ["length"]
    c = default_corpus()
    assert not a[0].text.startswith(" ") and a[0].text in {c.bare_texts[i] for i in c.sentence_starts}
    others = {"".join(t.text for t in await collect(Engine(FAST), "hello", max_tokens=30, seed=s)) for s in range(6)}
    assert len(others) > 1
    assert Engine(FAST).tokens_for("hello", max_tokens=30, seed=1) == a


async def test_generate_counts_completed_and_rejects_bad_max_tokens() -> None:
    engine = Engine(FAST)
    await collect(engine, max_tokens=3)
    assert (engine.running, engine.completed, engine.aborted, engine.failed) == (0, 1, 0, 0)
    with pytest.raises(ValueError):
        await collect(engine, max_tokens=0)


async def test_generate_wraps_around_the_corpus() -> None:
    engine = Engine(FAST)
    n = len(engine.corpus) + 50
    toks = await collect(engine, max_tokens=n)
    assert len(toks) == n and toks[-1].finish_reason == "length"


async def test_aclose_mid_generation_counts_an_abort() -> None:
    engine = Engine(EngineConfig(ttft=0.0, tpot=30.0))
    gen = engine.generate("p", max_tokens=10, seed=None, controls=EngineControls())
    first = await gen.__anext__()
    assert first.index == 0 and engine.running == 1
    await gen.aclose()
    assert (engine.running, engine.aborted, engine.completed) == (0, 1, 0)


async def test_cancel_while_sleeping_counts_an_abort() -> None:
    engine = Engine(EngineConfig(ttft=30.0, tpot=0.0))

    async def consume() -> None:
        async for _ in engine.generate("p", max_tokens=5, seed=None):
            pass

    task = asyncio.create_task(consume())
    await wait_for(lambda: engine.running == 1, "generation to start")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (engine.running, engine.aborted) == (0, 1)


async def test_closing_after_the_last_token_is_not_an_abort() -> None:
    engine = Engine(FAST)
    gen = engine.generate("p", max_tokens=2, seed=None)
    assert (await gen.__anext__()).finish_reason is None
    assert (await gen.__anext__()).finish_reason == "length"
    await gen.aclose()
    assert (engine.completed, engine.aborted) == (1, 0)


async def test_fail_after_raises_engine_error() -> None:
    engine = Engine(FAST)
    got: list[Token] = []
    with pytest.raises(EngineError):
        async for t in engine.generate("p", max_tokens=10, seed=None, controls=EngineControls(fail_after=3)):
            got.append(t)
    assert len(got) == 3 and (engine.failed, engine.running) == (1, 0)


async def test_pauses_and_ttft_delay_tokens() -> None:
    engine = Engine(FAST)
    ctl = EngineControls(ttft=0.5, tpot=0.0, pauses={3: 1.0})
    start = time.monotonic()
    stamps: list[float] = []
    async for _ in engine.generate("p", max_tokens=5, seed=None, controls=ctl):
        stamps.append(time.monotonic())
    assert stamps[0] - start >= 0.45  # sleep never returns early
    assert stamps[3] - stamps[2] >= 0.9
    assert stamps[2] - stamps[0] < stamps[3] - stamps[2]  # the silence is before token 3, not elsewhere


def test_stop_matcher_holds_back_possible_prefixes() -> None:
    m = StopMatcher(["b c", "zz"])
    assert m.push(Token(1, "a", 0)) == [Token(1, "a", 0)]
    assert m.push(Token(2, " b", 1)) == []  # " b" could start "b c"
    out = m.push(Token(3, " c d", 2))
    assert out == [Token(3, " ", 2, "stop")]
    m = StopMatcher(["xyz"])
    assert m.push(Token(1, "x", 0)) == []
    assert m.push(Token(2, "y", 1, "length")) == [Token(1, "x", 0), Token(2, "y", 1, "length")]
    with pytest.raises(ValueError):
        StopMatcher([""])


async def test_generate_with_stop_truncates_before_the_stop_string() -> None:
    engine = Engine(FAST)
    full = "".join(t.text for t in engine.tokens_for("p", max_tokens=40, seed=None))
    stop = full[25:31]
    assert full.find(stop) == 25
    toks = await collect(engine, max_tokens=40, stop=[stop])
    assert "".join(t.text for t in toks) == full[:25]
    assert toks[-1].finish_reason == "stop" and all(t.finish_reason is None for t in toks[:-1])
    assert engine.completed == 1 and engine.aborted == 0


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        EngineConfig(tpot=-1)
    with pytest.raises(ValueError):
        EngineConfig(max_tokens_default=10, max_tokens_limit=5)
    with pytest.raises(ValueError):
        create_engine_app(EngineConfig(ttft=1), Engine(EngineConfig(ttft=2)))


# ---------------------------------------------------------------------------------------------- HTTP app


@pytest.mark.parametrize("path", [CHAT, COMP])
async def test_streamed_text_equals_non_streamed(path: str) -> None:
    chat = path == CHAT
    base: dict[str, Any] = {"messages": MSGS} if chat else {"prompt": "Once upon a time"}
    base |= {"max_tokens": 40, "seed": 3}
    async with client_for(create_engine_app(FAST)) as c:
        full = await post(c, path, base)
        streamed = await post(c, path, base | {"stream": True, "stream_options": {"include_usage": True}})
    assert full.status_code == 200 and streamed.status_code == 200
    obj = full.json()
    choice = obj["choices"][0]
    text = choice["message"]["content"] if chat else choice["text"]
    assert obj["object"] == ("chat.completion" if chat else "text_completion")
    assert choice["finish_reason"] == "length"
    assert obj["usage"]["completion_tokens"] == 40
    assert obj["usage"]["total_tokens"] == obj["usage"]["prompt_tokens"] + 40
    events = sse_events(streamed.text)
    assert stream_text(events, chat) == text and len(text.split()) >= 20
    assert json.loads(events[-2])["usage"] == obj["usage"]


async def test_chat_chunk_format() -> None:
    async with client_for(create_engine_app(FAST)) as c:
        r = await post(c, CHAT, {"messages": MSGS, "max_tokens": 5, "stream": True})
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 1 + 5 + 1  # role, one per token, finish; no usage chunk unless asked
    assert {(ch["id"], ch["object"], ch["created"], ch["model"]) for ch in chunks} == {
        (chunks[0]["id"], "chat.completion.chunk", chunks[0]["created"], "eloquent-builtin")
    }
    assert chunks[0]["id"].startswith("chatcmpl-")
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(set(ch["choices"][0]["delta"]) == {"content"} for ch in chunks[1:-1])
    assert chunks[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    assert all("usage" not in ch for ch in chunks)
    for e in events[:-1]:  # pre-rendered chunks are byte-identical to compact json.dumps
        assert e == json.dumps(json.loads(e), separators=(",", ":"), ensure_ascii=False)


async def test_completion_chunk_format_with_usage() -> None:
    async with client_for(create_engine_app(FAST)) as c:
        r = await post(
            c, COMP, {"prompt": "x", "max_tokens": 3, "stream": True, "stream_options": {"include_usage": True}}
        )
    events = sse_events(r.text)
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and len(chunks) == 3 + 2
    assert all(ch["object"] == "text_completion" for ch in chunks)
    assert all(ch["usage"] is None for ch in chunks[:-1])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3
    assert chunks[-2]["choices"][0]["finish_reason"] == "length" and chunks[-2]["choices"][0]["text"] == ""


async def test_http_determinism_across_apps_and_seeds() -> None:
    body = {"prompt": "same prompt", "max_tokens": 25, "seed": 42}
    texts = []
    for _ in range(2):
        async with client_for(create_engine_app(FAST)) as c:
            texts.append((await post(c, COMP, body)).json()["choices"][0]["text"])
    assert texts[0] == texts[1]
    async with client_for(create_engine_app(FAST)) as c:
        variants = {(await post(c, COMP, body | {"seed": s})).json()["choices"][0]["text"] for s in range(6)}
    assert len(variants) > 1


@pytest.mark.parametrize("stream", [False, True])
async def test_stop_strings_over_http(stream: bool) -> None:
    engine = Engine(FAST)
    full = "".join(t.text for t in engine.tokens_for("p", max_tokens=50, seed=9))
    stop = full[30:36]
    cut = full.find(stop)
    body: dict[str, Any] = {"prompt": "p", "seed": 9, "max_tokens": 50, "stop": [stop, "no-such-stop-string"]}
    async with client_for(create_engine_app(engine=engine)) as c:
        r = await post(c, COMP, body | {"stream": stream})
        single = await post(c, COMP, body | {"stop": stop})
    if stream:
        events = sse_events(r.text)
        assert stream_text(events, chat=False) == full[:cut]
        assert json.loads(events[-2])["choices"][0]["finish_reason"] == "stop"
    else:
        assert r.json()["choices"][0] == {"index": 0, "text": full[:cut], "logprobs": None, "finish_reason": "stop"}
    assert single.json()["choices"][0]["text"] == full[:cut]
    assert engine.aborted == 0


def _too_deep() -> str:
    return "[" * 100_000 + "]" * 100_000


BAD_BODIES: list[tuple[str, str, Any, int, str | None]] = [
    # (id, path, body (str = raw bytes), status, param)
    ("invalid_json", CHAT, "{not json", 400, None),
    ("empty_body", CHAT, "", 400, None),
    ("not_an_object", CHAT, "[1, 2]", 400, None),
    ("deep_json", COMP, _too_deep(), 400, None),
    ("non_utf8", COMP, b"\xff\xfe{", 400, None),
    ("no_messages", CHAT, {}, 400, "messages"),
    ("empty_messages", CHAT, {"messages": []}, 400, "messages"),
    ("message_not_object", CHAT, {"messages": ["hi"]}, 400, "messages[0]"),
    ("bad_role", CHAT, {"messages": [{"role": "robot", "content": "x"}]}, 400, "messages[0].role"),
    ("bad_content", CHAT, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    (
        "image_part",
        CHAT,
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        400,
        "messages[0].content[0]",
    ),
    ("no_prompt", COMP, {}, 400, "prompt"),
    ("empty_prompt", COMP, {"prompt": ""}, 400, "prompt"),
    ("batch_prompt", COMP, {"prompt": ["a", "b"]}, 400, "prompt"),
    ("model_type", COMP, {"prompt": "x", "model": 3}, 400, "model"),
    ("unknown_model", COMP, {"prompt": "x", "model": "gpt-4o"}, 404, "model"),
    ("max_tokens_zero", COMP, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens_big", COMP, {"prompt": "x", "max_tokens": 10**6}, 400, "max_tokens"),
    ("max_tokens_str", COMP, {"prompt": "x", "max_tokens": "5"}, 400, "max_tokens"),
    ("max_tokens_bool", COMP, {"prompt": "x", "max_tokens": True}, 400, "max_tokens"),
    ("max_completion_tokens", CHAT, {"messages": MSGS, "max_completion_tokens": -1}, 400, "max_completion_tokens"),
    ("n_two", COMP, {"prompt": "x", "n": 2}, 400, "n"),
    ("stream_str", COMP, {"prompt": "x", "stream": "yes"}, 400, "stream"),
    (
        "stream_options_no_stream",
        COMP,
        {"prompt": "x", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    (
        "include_usage_type",
        COMP,
        {"prompt": "x", "stream": True, "stream_options": {"include_usage": 1}},
        400,
        "stream_options.include_usage",
    ),
    ("temperature", COMP, {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ("top_p_range", COMP, {"prompt": "x", "top_p": 3}, 400, "top_p"),
    ("seed_float", COMP, {"prompt": "x", "seed": 1.5}, 400, "seed"),
    ("stop_type", COMP, {"prompt": "x", "stop": 5}, 400, "stop"),
    ("stop_empty", COMP, {"prompt": "x", "stop": [""]}, 400, "stop"),
    ("controls_type", COMP, {"prompt": "x", "eloquent_engine": 5}, 400, "eloquent_engine"),
    ("controls_unknown", COMP, {"prompt": "x", "eloquent_engine": {"speed": 1}}, 400, "eloquent_engine"),
    ("controls_ttft", COMP, {"prompt": "x", "eloquent_engine": {"ttft": -1}}, 400, "eloquent_engine.ttft"),
    ("controls_tpot", COMP, {"prompt": "x", "eloquent_engine": {"tpot": "fast"}}, 400, "eloquent_engine.tpot"),
    (
        "controls_pause_key",
        COMP,
        {"prompt": "x", "eloquent_engine": {"pauses": {"a": 1}}},
        400,
        "eloquent_engine.pauses",
    ),
    (
        "controls_pause_value",
        COMP,
        {"prompt": "x", "eloquent_engine": {"pauses": {"1": 1e9}}},
        400,
        "eloquent_engine.pauses.1",
    ),
    (
        "controls_fail_after",
        COMP,
        {"prompt": "x", "eloquent_engine": {"fail_after": -1}},
        400,
        "eloquent_engine.fail_after",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "param"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES]
)
async def test_validation_errors(path: str, body: Any, status: int, param: str | None) -> None:
    app = create_engine_app(FAST)
    async with client_for(app) as c:
        if isinstance(body, dict):
            r = await c.post(path, json=body)
        else:
            r = await c.post(
                path,
                content=body.encode() if isinstance(body, str) else body,
                headers={"content-type": "application/json"},
            )
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["message"] and err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert app.state.engine.stats().completed == 0


async def test_body_too_large_by_header_and_by_bytes_read() -> None:
    app = create_engine_app(EngineConfig(ttft=0, tpot=0, max_body_bytes=100))
    big = json.dumps({"prompt": "x" * 200}).encode()

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: only the bytes read can tell
        for i in range(0, len(big), 50):
            yield big[i : i + 50]

    async with client_for(app) as c:
        by_header = await c.post(COMP, content=big)
        by_bytes = await c.post(COMP, content=chunked())
        lying = await c.post(COMP, content=big, headers={"content-length": "abc"})
        ok = await c.post(COMP, json={"prompt": "x", "max_tokens": 1})
    assert "content-length" not in by_bytes.request.headers
    for r in (by_header, by_bytes):
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert lying.status_code == 400
    assert ok.status_code == 200


async def test_fail_after_gives_in_band_error_then_done() -> None:
    app = create_engine_app(FAST)
    body = {"messages": MSGS, "max_tokens": 10, "stream": True, "eloquent_engine": {"fail_after": 4}}
    async with client_for(app) as c:
        r = await post(c, CHAT, body)
        r2 = await post(c, CHAT, body | {"stream": False})
        stats = (await c.get("/v1/engine/stats")).json()
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2]) == {
        "error": {
            "message": "engine failed after 4 tokens (fail_after=4)",
            "type": "EngineError",
            "param": None,
            "code": 500,
        }
    }
    assert len(events) == 1 + 4 + 2  # role, 4 tokens, error, [DONE]
    assert r2.status_code == 500 and r2.json()["error"]["type"] == "EngineError"
    assert stats == {"running": 0, "completed": 0, "aborted": 0, "failed": 2}


async def test_raise_errors_lets_engine_error_escape_the_body_iterator() -> None:
    app = create_engine_app(EngineConfig(ttft=0, tpot=0, raise_errors=True))
    body = {"prompt": "x", "max_tokens": 10, "stream": True, "eloquent_engine": {"fail_after": 2}}
    async with client_for(app) as c:
        with pytest.raises(EngineError):
            await post(c, COMP, body)
    assert app.state.engine.failed == 1


async def test_models_health_stats_and_unknown_routes() -> None:
    app = create_engine_app(EngineConfig(model="m1", ttft=0, tpot=0))
    async with client_for(app) as c:
        models = (await c.get("/v1/models")).json()
        health = await c.get("/health")
        ok = await post(c, COMP, {"prompt": "x", "model": "m1", "max_tokens": 2})
        stats = (await c.get("/v1/engine/stats")).json()
        missing = await c.get("/v2/nothing")
        wrong_method = await c.get(CHAT)
    assert [m["id"] for m in models["data"]] == ["m1"] and models["object"] == "list"
    assert health.status_code == 200
    assert ok.json()["model"] == "m1"
    assert stats == {"running": 0, "completed": 1, "aborted": 0, "failed": 0}
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    assert wrong_method.status_code == 405 and "error" in wrong_method.json()


async def test_concurrency_limit_answers_503() -> None:
    app = create_engine_app(EngineConfig(ttft=0, tpot=0, max_concurrency=1))
    engine: Engine = app.state.engine
    async with client_for(app) as c:
        long = asyncio.create_task(post(c, COMP, {"prompt": "x", "stream": True, "eloquent_engine": {"ttft": 60}}))
        await wait_for(lambda: engine.running == 1, "the first request to start")
        r = await post(c, COMP, {"prompt": "x", "max_tokens": 1})
        long.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await long
        await wait_for(lambda: engine.running == 0, "the first request to end")
        again = await post(c, COMP, {"prompt": "x", "max_tokens": 1})
    assert r.status_code == 503 and r.json()["error"]["code"] == "server_overloaded"
    assert again.status_code == 200


# ---------------------------------------------------------------------------------------------- real server


async def test_openai_sdk_against_uvicorn() -> None:
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.001))
    messages: Any = MSGS
    async with serve(app) as url:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        chat = await client.chat.completions.create(model="eloquent-builtin", messages=messages, max_tokens=20, seed=5)
        chunks = [
            c
            async for c in await client.chat.completions.create(
                model="eloquent-builtin",
                messages=messages,
                max_tokens=20,
                seed=5,
                stream=True,
                stream_options={"include_usage": True},
            )
        ]
        comp = await client.completions.create(model="eloquent-builtin", prompt="Hi", max_tokens=15, stop=["."])
        comp_chunks = [
            c
            async for c in await client.completions.create(
                model="eloquent-builtin", prompt="Hi", max_tokens=15, stop=["."], stream=True
            )
        ]
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="nope", prompt="Hi")
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(model="eloquent-builtin", prompt="Hi", n=3)
        await client.close()
    assert chat.choices[0].message.content
    assert chat.usage is not None and chat.usage.completion_tokens == 20
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == chat.choices[0].message.content
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 20
    assert comp.choices[0].text == "".join(c.choices[0].text for c in comp_chunks)
    assert comp.choices[0].finish_reason == comp_chunks[-1].choices[0].finish_reason
    assert "." not in comp.choices[0].text


async def test_client_disconnect_mid_stream_aborts_generation() -> None:
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.02))
    engine: Engine = app.state.engine
    async with serve(app) as url, httpx.AsyncClient(base_url=url) as c:
        body = {"messages": MSGS, "max_tokens": 5000, "stream": True}
        async with c.stream("POST", CHAT, json=body) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            seen = 0
            async for line in lines:
                seen += line.startswith("data: ")
                if seen >= 3:
                    break
            assert engine.running == 1
        # leaving the block closes the connection mid-stream
        await wait_for(lambda: engine.aborted == 1 and engine.running == 0, "the abort to be counted")
        stats = (await c.get("/v1/engine/stats")).json()
    assert stats == {"running": 0, "completed": 0, "aborted": 1, "failed": 0}


async def test_client_disconnect_during_non_streaming_request_aborts() -> None:
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.0))
    engine: Engine = app.state.engine
    async with serve(app) as url, httpx.AsyncClient(base_url=url) as c:
        body = {"prompt": "x", "max_tokens": 5, "eloquent_engine": {"ttft": 60}}
        task = asyncio.create_task(c.post(COMP, json=body))
        await wait_for(lambda: engine.running == 1, "generation to start")
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await wait_for(lambda: engine.aborted == 1 and engine.running == 0, "the abort to be counted")
