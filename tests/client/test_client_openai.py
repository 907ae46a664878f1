"""Existing httpx code over Eloquent delivery: the real openai SDK -- 3.x, on httpx2, through
``openai.DefaultAsyncHttpxClient`` / ``DefaultHttpxClient``, and through the older httpx clients (the SDK's
legacy path) -- and httpx-sse, via ``AsyncEloquentTransport`` / ``EloquentTransport`` against ``eloquent serve``,
with the UDP path behind ``eloquent relay``-style loss (10 %, mean burst 2): chat and completions, async and
sync, streaming and not. Every text equals the plain SSE path's, and each response says how it came
(``eloquent-delivery``). Also: README.md's openai snippet passes mypy and runs as written; a dead server fails
as fast as with plain httpx."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import httpx2
import pytest
from eloquent_client import AsyncEloquentTransport, EloquentTransport, PathMemory
from eloquent_client.sync import LoopThread
from httpx_sse import aconnect_sse

from eloquent_plugins.sim.netem import PathConfig
from eloquent_plugins.sim.udp_relay import Relay, RelayConfig, start_relay
from tests.support.client_servers import CHAT, MODEL, Served, chat_body, eloquent_serve

REPO = Path(__file__).resolve().parents[2]
LOSSY = PathConfig(loss=0.10, burst=2.0, delay=0.005)
import openai  # noqa: E402


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with eloquent_serve("--tpot", "0.004", "--ttft", "0.02") as s:
        yield s


@pytest.fixture
async def relay(served: Served) -> AsyncIterator[Relay]:
    r = await start_relay(RelayConfig(target=("127.0.0.1", served.udp_port), upstream=LOSSY, downstream=LOSSY,
                                      seed=7))
    yield r
    await r.close()


def transport_options(relay: Relay) -> dict[str, object]:
    # h3_probe_timeout: generous, so a slow handshake on a loaded CI box never turns into the TCP fallback here.
    return {"verify": False, "h3_port": relay.listen_addr[1], "h3_probe_timeout": 10.0, "path_memory": PathMemory()}


def delivery_seen(client: httpx.AsyncClient | httpx.Client | httpx2.AsyncClient | httpx2.Client,
                  seen: list[str]) -> None:
    def hook(response: httpx.Response | httpx2.Response) -> None:
        seen.append(response.headers.get("eloquent-delivery", "?"))

    async def ahook(response: httpx.Response | httpx2.Response) -> None:
        hook(response)

    client.event_hooks["response"] = [ahook if isinstance(client, httpx.AsyncClient | httpx2.AsyncClient)
                                      else hook]  # type: ignore[list-item]


async def test_openai_async_chat_and_completions_over_lossy_datagrams(served: Served, relay: Relay) -> None:
    seen: list[str] = []
    http = httpx.AsyncClient(transport=AsyncEloquentTransport(**transport_options(relay)))
    delivery_seen(http, seen)
    client = openai.AsyncOpenAI(base_url=served.http + "/v1", api_key="test-key", http_client=http)
    try:
        for i in range(3):
            prompt = f"Tell me about lossy rivers {i}."
            stream = await client.chat.completions.create(model=MODEL, stream=True, max_tokens=60,
                                                          messages=[{"role": "user", "content": prompt}])
            text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
            assert text == served.text(prompt, 60) and len(text) > 50
        completion = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=50,
                                                     stream=True)
        text = "".join([chunk.choices[0].text async for chunk in completion])
        assert text == served.completion_text("Once upon a time", 50)
        models = await client.models.list()  # not a stream: over the HTTP/3 request stream
        assert [m.id for m in models.data] == [MODEL]
    finally:
        await client.close()
    assert seen == ["datagram"] * 4 + ["h3-stream"]
    assert relay.stats.downstream.dropped + relay.stats.upstream.dropped > 0  # the link really lost packets


def relay_beside(served: Served, seed: int) -> tuple[LoopThread, Relay]:
    """A lossy relay on a loop thread of its own (a sync test has no running loop)."""

    async def start() -> Relay:
        return await start_relay(RelayConfig(target=("127.0.0.1", served.udp_port), upstream=LOSSY,
                                             downstream=LOSSY, seed=seed))

    portal = LoopThread("relay")
    return portal, portal.run(start())


def test_openai_sync_chat_and_completions_over_lossy_datagrams(served: Served) -> None:
    portal, relay = relay_beside(served, seed=8)
    seen: list[str] = []
    http = httpx.Client(transport=EloquentTransport(**transport_options(relay)))
    delivery_seen(http, seen)
    try:
        client = openai.OpenAI(base_url=served.http + "/v1", api_key="test-key", http_client=http)
        prompt = "Tell me about sync mountains."
        stream = client.chat.completions.create(model=MODEL, stream=True, max_tokens=60,
                                                messages=[{"role": "user", "content": prompt}])
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == served.text(prompt, 60)
        completion = client.completions.create(model=MODEL, prompt="Far away", max_tokens=40, stream=True)
        assert "".join(c.choices[0].text for c in completion) == served.completion_text("Far away", 40)
        client.close()
    finally:
        portal.run(relay.close())
        portal.close()
    assert seen == ["datagram", "datagram"]


async def test_httpx_sse_reads_the_same_events_as_the_plain_path(served: Served, relay: Relay) -> None:
    body = chat_body("Tell me about events.", 50)
    async with httpx.AsyncClient(timeout=60) as plain:
        async with aconnect_sse(plain, "POST", served.http + CHAT, json=body) as source:
            expected = [(sse.event, sse.data) async for sse in source.aiter_sse()]
    async with httpx.AsyncClient(transport=AsyncEloquentTransport(**transport_options(relay))) as client:
        async with aconnect_sse(client, "POST", served.http + CHAT, json=body) as source:
            assert source.response.headers["eloquent-delivery"] == "datagram"
            assert source.response.headers["content-type"].startswith("text/event-stream")
            token = source.response.headers["x-eloquent-stream"]
            got = [sse async for sse in source.aiter_sse()]
    # ids are the stream's own (<token>:<index>), so httpx-sse's Last-Event-ID logic works as on the SSE path;
    # the chunk ids and timestamps differ between two requests, the text does not.
    assert [s.id for s in got] == [f"{token}:{i}" for i in range(len(got))]
    strip = re.compile(r'"(id|created)":("[^"]*"|\d+)')
    assert [(s.event, strip.sub("", s.data)) for s in got] == [(e, strip.sub("", d)) for e, d in expected]


async def test_errors_come_back_as_the_servers_own_responses(served: Served, relay: Relay) -> None:
    async with httpx.AsyncClient(transport=AsyncEloquentTransport(**transport_options(relay))) as client:
        missing = await client.post(served.http + CHAT, json={**chat_body("x"), "model": "nope"})
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"
        assert missing.headers["eloquent-delivery"] == "h3-stream"
        client_openai = openai.AsyncOpenAI(base_url=served.http + "/v1", api_key="k", http_client=client,
                                           max_retries=0)
        with pytest.raises(openai.NotFoundError):
            await client_openai.chat.completions.create(model="nope", stream=True,
                                                        messages=[{"role": "user", "content": "x"}])


def plain_answers(served: Served, prompts: list[str]) -> tuple[list[str], str]:
    """What the SDK reads over plain SSE (its own default client, no Eloquent transport): the reference."""
    client = openai.OpenAI(base_url=served.http + "/v1", api_key="test-key")
    try:
        chats = []
        for prompt in prompts:
            stream = client.chat.completions.create(model=MODEL, stream=True, max_tokens=60,
                                                    messages=[{"role": "user", "content": prompt}])
            chats.append("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=50, stream=True)
        return chats, "".join(c.choices[0].text for c in completion)
    finally:
        client.close()


PROMPTS = ["Tell me about httpx2 rivers.", "Tell me about httpx2 hills."]


async def test_openai3_async_over_httpx2_transport_streaming_and_not(served: Served, relay: Relay) -> None:
    chats, completion_text = plain_answers(served, PROMPTS)
    seen: list[str] = []
    http = openai.DefaultAsyncHttpxClient(transport=AsyncEloquentTransport(**transport_options(relay)))
    assert isinstance(http, httpx2.AsyncClient)  # the SDK 3.x's own client class: httpx2, not httpx
    delivery_seen(http, seen)
    client = openai.AsyncOpenAI(base_url=served.http + "/v1", api_key="test-key", http_client=http)
    try:
        for prompt, expected in zip(PROMPTS, chats, strict=True):
            stream = await client.chat.completions.create(model=MODEL, stream=True, max_tokens=60,
                                                          messages=[{"role": "user", "content": prompt}])
            text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
            assert text == expected and len(text) > 50
        completion = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=50,
                                                     stream=True)
        assert "".join([chunk.choices[0].text async for chunk in completion]) == completion_text
        whole = await client.chat.completions.create(model=MODEL, max_tokens=60,
                                                     messages=[{"role": "user", "content": PROMPTS[0]}])
        assert whole.choices[0].message.content == chats[0]
        plain = await client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=50)
        assert plain.choices[0].text == completion_text
    finally:
        await client.close()
    assert seen == ["datagram"] * 3 + ["h3-stream"] * 2
    assert relay.stats.downstream.dropped + relay.stats.upstream.dropped > 0  # the link really lost packets


def test_openai3_sync_over_httpx2_transport_streaming_and_not(served: Served) -> None:
    chats, completion_text = plain_answers(served, PROMPTS)

    portal, relay = relay_beside(served, seed=9)
    seen: list[str] = []
    http = openai.DefaultHttpxClient(transport=EloquentTransport(**transport_options(relay)))
    assert isinstance(http, httpx2.Client)
    delivery_seen(http, seen)
    try:
        client = openai.OpenAI(base_url=served.http + "/v1", api_key="test-key", http_client=http)
        for prompt, expected in zip(PROMPTS, chats, strict=True):
            stream = client.chat.completions.create(model=MODEL, stream=True, max_tokens=60,
                                                    messages=[{"role": "user", "content": prompt}])
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected
        completion = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=50, stream=True)
        assert "".join(c.choices[0].text for c in completion) == completion_text
        whole = client.chat.completions.create(model=MODEL, max_tokens=60,
                                               messages=[{"role": "user", "content": PROMPTS[1]}])
        assert whole.choices[0].message.content == chats[1]
        plain = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=50)
        assert plain.choices[0].text == completion_text
        client.close()
        dropped = relay.stats.downstream.dropped + relay.stats.upstream.dropped
    finally:
        portal.run(relay.close())
        portal.close()
    assert seen == ["datagram"] * 3 + ["h3-stream"] * 2
    assert dropped > 0


async def test_httpx2_client_streams_with_the_same_transport_class(served: Served, relay: Relay) -> None:
    """``httpx2.AsyncClient(transport=AsyncEloquentTransport(...))``: the answer is of the caller's module."""
    body = chat_body("Tell me about modules.", 40)
    async with httpx2.AsyncClient(transport=AsyncEloquentTransport(**transport_options(relay))) as client:
        async with client.stream("POST", served.http + CHAT, json=body) as response:
            assert isinstance(response, httpx2.Response)
            assert response.headers["eloquent-delivery"] == "datagram"
            raw = b"".join([chunk async for chunk in response.aiter_bytes()])
    assert b"data: [DONE]" in raw and raw.count(b"id: ") >= 10


async def test_dead_server_fails_at_once_through_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens (TCP refused): the SDK's connection error comes from TCP's refusal, within about a second,
    not after a wait on UDP (the transport's timeout is 30 s: a wait on UDP could not hide in the bound)."""
    from eloquent_client import Http3ClientConnection

    from tests.support.servers import free_port

    waited: list[float] = []
    original = Http3ClientConnection.connect.__func__  # type: ignore[attr-defined]

    async def watched(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
        started = time.monotonic()
        try:
            return await original(cls, *args, **kwargs)
        finally:
            waited.append(time.monotonic() - started)

    monkeypatch.setattr(Http3ClientConnection, "connect", classmethod(watched))
    dead = f"http://127.0.0.1:{free_port()}/v1"
    transport = AsyncEloquentTransport(verify=False, path_memory=PathMemory())
    client = openai.AsyncOpenAI(base_url=dead, api_key="k", max_retries=0,
                                http_client=openai.DefaultAsyncHttpxClient(transport=transport))
    try:
        for stream in (True, False):
            started = time.monotonic()
            with pytest.raises(openai.APIConnectionError) as caught:
                await client.chat.completions.create(model=MODEL, stream=stream,
                                                     messages=[{"role": "user", "content": "x"}])
            elapsed = time.monotonic() - started
            chain = []
            error: BaseException | None = caught.value
            while error is not None:
                chain.append(error)
                error = error.__cause__ or error.__context__
            assert any(isinstance(e, httpx2.ConnectError) and "HTTP/3" not in str(e) for e in chain), chain
            assert elapsed < 2.0, f"{elapsed:.2f} s to fail against a dead port (stream={stream})"
    finally:
        await client.close()
    assert len(waited) >= 1 and all(w < 2.0 for w in waited), waited  # each handshake was given up, not waited


def _readme_openai_snippet() -> str:
    snippets = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.DOTALL)
    found = [s for s in snippets if "AsyncEloquentTransport" in s]
    assert len(found) == 1, "README.md should have one Python snippet using AsyncEloquentTransport"
    return found[0]


def test_readme_openai_snippet_passes_mypy(tmp_path: Path) -> None:
    """Type-checked against the installed SDK (3.x types ``http_client`` as ``httpx2.AsyncClient``)."""
    snippet = _readme_openai_snippet()
    (tmp_path / "snippet.py").write_text(snippet)
    env = {**os.environ, "MYPYPATH": os.pathsep.join([str(REPO / "client"), str(REPO)])}
    done = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--follow-imports=silent",
                           "--cache-dir", str(tmp_path / "cache"), str(tmp_path / "snippet.py")],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0 and "Success" in done.stdout, done.stdout + done.stderr


async def test_readme_openai_snippet_runs_as_written(served: Served) -> None:
    snippet = _readme_openai_snippet()
    assert "http_client=openai.DefaultAsyncHttpxClient(transport=AsyncEloquentTransport(verify=False))" in snippet
    assert "127.0.0.1:8000" in snippet
    code = snippet.replace("127.0.0.1:8000", f"127.0.0.1:{served.port}")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fp:
        fp.write(code)
    proc = await asyncio.create_subprocess_exec(sys.executable, fp.name, stdout=subprocess.PIPE,
                                                stderr=subprocess.PIPE, cwd=tempfile.gettempdir())
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    Path(fp.name).unlink()
    assert proc.returncode == 0, err.decode()
    prompt = re.search(r'"content": "([^"]*)"', snippet)
    assert prompt is not None
    assert out.decode() == served.text(prompt.group(1), 60) + "\n"
