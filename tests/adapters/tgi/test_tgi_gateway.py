"""The TGI gateway against the TGI-protocol reproduction: clients read through it exactly what they read direct.

Both servers run under uvicorn on loopback, each in its own thread (so the blocking ``text_generation.Client``
works too). The upstream keeps TGI's 15 s keep-alive, so no comment lands between events in these tests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
import text_generation
from eloquent_tgi.gateway import TGIGatewayError, create_tgi_gateway
from starlette.applications import Starlette
from text_generation import errors as tg_errors

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from tests.support.tgi_server import ERROR_MESSAGES, TGIServerState, create_tgi_server, run_in_thread

ERROR_TYPES = ("validation", "generation", "overloaded", "incomplete_generation", "tokenizer")
CLIENT_ERRORS: dict[str, type[Exception]] = {
    "validation": tg_errors.ValidationError,
    "generation": tg_errors.GenerationError,
    "overloaded": tg_errors.OverloadedError,
    "incomplete_generation": tg_errors.IncompleteGenerationError,
    "tokenizer": tg_errors.UnknownError,  # text-generation 0.7 has no class for it; the message still arrives
}
MESSAGES = [{"role": "user", "content": "Write a URL."}]


@dataclass(frozen=True)
class Servers:
    upstream: str
    gateway: str
    state: TGIServerState


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    app = create_tgi_server()
    with run_in_thread(app) as upstream, run_in_thread(create_tgi_gateway(upstream, StreamConfig())) as gateway:
        yield Servers(upstream, gateway, app.state.tgi)


def both(servers: Servers) -> tuple[str, str]:
    return servers.upstream, servers.gateway


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + path, json=body, timeout=30)


# ---------------------------------------------------------------------------------------------- bytes


STREAM_BODIES = [
    ("/generate_stream", {"inputs": "Test request", "parameters": {"max_new_tokens": 10, "details": True}}),
    ("/generate_stream", {"inputs": "Test request", "parameters": {"max_new_tokens": 30}}),
    ("/generate_stream", {"inputs": "Test request", "parameters": {"max_new_tokens": 4, "top_n_tokens": 2,
                                                                   "details": True, "seed": 7}}),
    ("/", {"inputs": "Test request", "stream": True, "parameters": {"details": True, "max_new_tokens": 12}}),
    ("/generate_stream", {"inputs": "Test request", "parameters": {"best_of": 2}}),
    ("/generate_stream", {"inputs": "", "parameters": {}}),
    ("/v1/chat/completions", {"model": "tgi", "messages": MESSAGES, "stream": True, "max_tokens": 5}),
    ("/v1/chat/completions", {"model": "tgi", "messages": MESSAGES, "stream": True,
                              "stream_options": {"include_usage": True}}),
    ("/v1/chat/completions", {"model": "tgi", "messages": [{"role": "user", "content": "x !error=generation "
                                                                                        "!after=2"}],
                              "stream": True}),
]


@pytest.mark.parametrize(("path", "body"), STREAM_BODIES)
def test_stream_bytes_are_forwarded_unchanged(servers: Servers, path: str, body: dict[str, Any]) -> None:
    direct, via = (post(url, path, body) for url in both(servers))
    assert via.status_code == direct.status_code == 200
    assert via.headers["content-type"] == direct.headers["content-type"] == "text/event-stream"
    assert via.content == direct.content
    assert via.content.startswith(b"data: ") and via.content.endswith(b"\n\n")


@pytest.mark.parametrize("error_type", ERROR_TYPES)
@pytest.mark.parametrize("after", [0, 3])
def test_error_events_arrive_in_tgi_format(servers: Servers, error_type: str, after: int) -> None:
    body = {"inputs": f"hello !error={error_type} !after={after}", "parameters": {"details": True}}
    direct, via = (post(url, "/generate_stream", body) for url in both(servers))
    assert via.status_code == 200  # TGI reports every stream error in-band, under the 200
    assert via.content == direct.content
    last = via.content.split(b"\n\n")[-2]
    assert last == f'data: {{"error":"{ERROR_MESSAGES[error_type]}","error_type":"{error_type}"}}'.encode()
    assert via.content.count(b'"index":') == after


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/generate", {"inputs": "Test request", "parameters": {"max_new_tokens": 10, "details": True}}),
    ("POST", "/", {"inputs": "Test request", "parameters": {"max_new_tokens": 3, "details": True,
                                                            "decoder_input_details": True}}),
    ("POST", "/", {"inputs": "Test request", "stream": False}),
    ("POST", "/generate", {"inputs": "x !error=overloaded"}),
    ("POST", "/generate", {"inputs": "x !error=generation"}),
    ("POST", "/generate", {"inputs": "x", "parameters": {"temperature": 0}}),
    ("POST", "/v1/chat/completions", {"model": "tgi", "messages": MESSAGES, "max_tokens": 4}),
    ("POST", "/v1/chat/completions", {"model": "tgi", "messages": []}),
    ("GET", "/info", None),
    ("GET", "/health", None),
    ("GET", "/no-such-route", None),
])
def test_other_routes_are_proxied_unchanged(servers: Servers, method: str, path: str, body: Any) -> None:
    direct, via = (httpx.request(method, url + path, json=body, timeout=30) for url in both(servers))
    assert (via.status_code, via.content) == (direct.status_code, direct.content)
    assert via.headers.get("content-type") == direct.headers.get("content-type")


def test_non_json_body_gets_tgis_own_rejection(servers: Servers) -> None:
    direct, via = (httpx.post(url + "/generate_stream", content=b"{not json", timeout=30,
                              headers={"content-type": "application/json"}) for url in both(servers))
    assert via.status_code == direct.status_code == 400
    assert via.content == direct.content


# ---------------------------------------------------------------------------------------------- clients


async def test_async_client_generate_stream_reads_the_same(servers: Servers) -> None:
    runs = []
    for url in both(servers):
        client = text_generation.AsyncClient(url, timeout=60)
        runs.append([r.model_dump() async for r in client.generate_stream("Test request", max_new_tokens=30)])
    assert runs[0] == runs[1]
    assert [r["token"]["text"] for r in runs[1]][-1] == "</s>"
    assert runs[1][-1]["generated_text"] == " for /api/v1/projects/1"
    assert all(r["details"] is None for r in runs[1][:-1])


async def test_async_client_generate_reads_the_same(servers: Servers) -> None:
    out = [(await text_generation.AsyncClient(url, timeout=60).generate("Test request", max_new_tokens=10,
                                                                        decoder_input_details=True)).model_dump()
           for url in both(servers)]
    assert out[0] == out[1]
    assert out[1]["generated_text"] == " for /api/v1/projects/1"
    assert out[1]["details"]["generated_tokens"] == 10


def test_sync_client_reads_the_same(servers: Servers) -> None:
    streams = [[r.model_dump() for r in text_generation.Client(url, timeout=60).generate_stream(
        "Test request", max_new_tokens=5, top_n_tokens=2)] for url in both(servers)]
    assert streams[0] == streams[1] and len(streams[1]) == 5
    assert streams[1][0]["top_tokens"][0]["id"] == 363
    whole = [text_generation.Client(url, timeout=60).generate("Test request", max_new_tokens=5).model_dump()
             for url in both(servers)]
    assert whole[0] == whole[1]
    assert whole[1]["generated_text"] == "".join(r["token"]["text"] for r in streams[1])


@pytest.mark.parametrize("error_type", ERROR_TYPES)
async def test_client_raises_the_same_typed_error(servers: Servers, error_type: str) -> None:
    raised = []
    for url in both(servers):
        client = text_generation.AsyncClient(url, timeout=60)
        seen = []
        with pytest.raises(CLIENT_ERRORS[error_type]) as info:
            async for r in client.generate_stream(f"x !error={error_type} !after=2"):
                seen.append(r.token.text)
        raised.append((type(info.value), str(info.value), seen))
    assert raised[0] == raised[1]
    assert raised[1][1] == ERROR_MESSAGES[error_type] and raised[1][2] == [" for", " /"]


@pytest.mark.parametrize("error_type", ERROR_TYPES)
def test_sync_generate_raises_the_same_typed_error(servers: Servers, error_type: str) -> None:
    raised = []
    for url in both(servers):
        with pytest.raises(CLIENT_ERRORS[error_type]) as info:
            text_generation.Client(url, timeout=60).generate(f"x !error={error_type}")
        raised.append((type(info.value), str(info.value)))
    assert raised[0] == raised[1]


async def test_openai_sdk_chat_stream_reads_the_same(servers: Servers) -> None:
    runs = []
    for url in both(servers):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0)
        stream = await client.chat.completions.create(model="tgi", messages=MESSAGES, stream=True,  # type: ignore
                                                      stream_options={"include_usage": True})
        runs.append([chunk.model_dump() async for chunk in stream])
        await client.close()
    assert runs[0] == runs[1]
    text = "".join(c["choices"][0]["delta"]["content"] for c in runs[1] if c["choices"])
    assert text == " for /api/v1/projects/1"
    assert runs[1][-1]["usage"]["completion_tokens"] == 11


async def test_openai_sdk_sees_the_same_stream_error(servers: Servers) -> None:
    results = []
    for url in both(servers):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0)
        stream = await client.chat.completions.create(  # type: ignore[call-overload]
            model="tgi", messages=[{"role": "user", "content": "x !error=overloaded !after=1"}], stream=True)
        chunks = []
        with pytest.raises(openai.APIError) as info:
            async for chunk in stream:
                chunks.append(chunk.model_dump())
        results.append((chunks, info.value.message))
        await client.close()
    assert results[0] == results[1]
    assert results[1][1] == "Model is overloaded" and len(results[1][0]) == 1


def test_openai_sdk_non_stream_reads_the_same(servers: Servers) -> None:
    out = []
    for url in both(servers):
        with openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0) as client:
            out.append(client.chat.completions.create(model="tgi", messages=MESSAGES,  # type: ignore
                                                      max_tokens=3).model_dump())
    assert out[0] == out[1] and out[1]["choices"][0]["message"]["content"] == " for /api"


# ---------------------------------------------------------------------------------------------- streaming


def test_gateway_answers_before_the_upstream_sends_anything(servers: Servers) -> None:
    """The SSE response starts at once, so the host's keep-alive can run while TGI queues."""
    with httpx.stream("POST", servers.gateway + "/generate_stream", timeout=30,
                      json={"inputs": "x !hold=early", "parameters": {"max_new_tokens": 2}}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        servers.state.release("early")
        body = response.read()
    assert body.count(b"\n\n") == 2


def test_each_upstream_event_is_its_own_message(servers: Servers) -> None:
    with httpx.stream("POST", servers.gateway + "/generate_stream", timeout=30,
                      json={"inputs": "x !hold=step !holdat=1", "parameters": {"max_new_tokens": 3}}) as response:
        chunks = response.iter_raw()
        first = next(chunks)  # the upstream is held after its first event: that event must come through alone
        assert first.startswith(b'data: {"index":1,') and first.endswith(b"\n\n") and first.count(b"\n\n") == 1
        servers.state.release("step")
        rest = b"".join(chunks)
    assert rest.count(b"\n\n") == 2


def test_client_disconnect_reaches_the_upstream(servers: Servers) -> None:
    state = servers.state
    started, disconnects = state.started, state.disconnects
    with httpx.stream("POST", servers.gateway + "/generate_stream", timeout=30,
                      json={"inputs": "x !hold=never-released", "parameters": {"max_new_tokens": 5}}) as response:
        assert response.status_code == 200
        assert state.wait_for("started", started + 1)
    # leaving the block closes the client connection while the upstream is still generating
    assert state.wait_for("disconnects", disconnects + 1), "the upstream request was not closed"


async def test_client_disconnect_mid_stream_reaches_the_upstream(servers: Servers) -> None:
    state = servers.state
    disconnects = state.disconnects
    client = text_generation.AsyncClient(servers.gateway, timeout=60)
    got = []
    async for response in client.generate_stream("x !loop !hold=mid !holdat=3", max_new_tokens=100):
        got.append(response.token.text)
        if len(got) == 2:
            break
    assert got == [" for", " /"]
    assert await asyncio.to_thread(state.wait_for, "disconnects", disconnects + 1)


def test_chat_disconnect_reaches_the_upstream(servers: Servers) -> None:
    state = servers.state
    started, disconnects = state.started, state.disconnects
    body = {"model": "tgi", "messages": [{"role": "user", "content": "x !hold=chat-gone"}], "stream": True}
    with httpx.stream("POST", servers.gateway + "/v1/chat/completions", json=body, timeout=30):
        assert state.wait_for("started", started + 1)
    assert state.wait_for("disconnects", disconnects + 1)


# ---------------------------------------------------------------------------------------------- failures


async def test_a_silent_upstream_stream_is_ended_and_closed(servers: Servers) -> None:
    """TGI writes at least a keep-alive every 15 s; a stream silent past ``stream_idle_timeout`` is dead."""
    state = servers.state
    disconnects = state.disconnects
    gateway = create_tgi_gateway(servers.upstream, stream_idle_timeout=0.2)
    async with _gateway_client(gateway) as client:
        response = await client.post("/generate_stream", json={"inputs": "x !hold=silent !holdat=1"})
    first, last = response.content.split(b"\n\n")[:2]
    assert first.startswith(b'data: {"index":1,')
    assert last.startswith(b'data: {"error":"TGI upstream stream broke: ReadTimeout')
    assert last.endswith(b'"error_type":"incomplete_generation"}')
    assert await asyncio.to_thread(state.wait_for, "disconnects", disconnects + 1)


def _gateway_client(gateway: Starlette) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gateway")


def _mock_upstream(body: bytes, status: int = 200, content_type: str = "text/event-stream") -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=body, headers={"content-type": content_type})

    return httpx.MockTransport(handler)


async def test_unreachable_upstream_is_a_generation_error() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    gateway = create_tgi_gateway("http://127.0.0.1:9", transport=httpx.MockTransport(refuse))
    async with _gateway_client(gateway) as client:
        stream = await client.post("/generate_stream", json={"inputs": "x"})
        chat = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
        info = await client.get("/info")
    assert stream.status_code == 200
    assert stream.content.startswith(b'data: {"error":"TGI upstream http://127.0.0.1:9 unreachable')
    assert stream.content.endswith(b'"error_type":"generation"}\n\n')
    assert chat.content.endswith(b'"http_status_code":502}}\n\ndata: [DONE]\n\n')
    assert info.status_code == 502 and info.json()["error_type"] == "generation"


async def test_upstream_that_stops_early_is_an_incomplete_generation() -> None:
    cut = b'data: {"index":1,"token":{"id":363,"text":" for","logprob":-1.5,"special":false},' \
          b'"generated_text":null,"details":null}\n\n'
    gateway = create_tgi_gateway("http://tgi.invalid", transport=_mock_upstream(cut))
    async with _gateway_client(gateway) as client:
        body = (await client.post("/generate_stream", json={"inputs": "x"})).content
    assert body == cut + b'data: {"error":"Incomplete generation stream","error_type":"incomplete_generation"}\n\n'


async def test_chat_stream_without_done_is_closed_in_tgi_format() -> None:
    chunk = b'data: {"object":"chat.completion.chunk","choices":[]}\n\n'
    gateway = create_tgi_gateway("http://tgi.invalid", transport=_mock_upstream(chunk))
    async with _gateway_client(gateway) as client:
        body = (await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})).content
    assert body == chunk + (b'data: {"error":{"message":"Incomplete generation stream","http_status_code":500}}'
                            b'\n\ndata: [DONE]\n\n')


async def test_rejection_after_our_200_becomes_an_event() -> None:
    """TGI answers chat template errors with a 422 before streaming; we already sent 200, so it goes in-band."""
    rejection = b'{"error":"Template error: bad","error_type":"template_error"}'
    gateway = create_tgi_gateway("http://tgi.invalid", transport=_mock_upstream(rejection, 422, "application/json"))
    async with _gateway_client(gateway) as client:
        chat = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": True})
        gen = await client.post("/generate_stream", json={"inputs": "x"})
    assert chat.content == (b'data: {"error":{"message":"Template error: bad","http_status_code":422}}\n\n'
                            b'data: [DONE]\n\n')
    assert gen.content == b"data: " + rejection + b"\n\n"


async def test_oversized_request_is_refused_before_the_upstream() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(200)

    gateway = create_tgi_gateway("http://tgi.invalid", StreamConfig(max_request_bytes=64),
                                 transport=httpx.MockTransport(handler))
    async with _gateway_client(gateway) as client:
        response = await client.post("/generate_stream", json={"inputs": "x" * 100})
    assert response.status_code == 413 and response.json()["error_type"] == "validation"
    assert calls == []


async def test_request_headers_and_query_reach_the_upstream() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, stream=httpx.ByteStream(b'{"ok":true}'))

    gateway = create_tgi_gateway("http://tgi.invalid/prefix", transport=httpx.MockTransport(handler))
    async with _gateway_client(gateway) as client:
        response = await client.get("/tokenize?x=1", headers={"authorization": "Bearer k"})
    assert response.content == b'{"ok":true}'
    assert str(seen[0].url) == "http://tgi.invalid/prefix/tokenize?x=1"
    assert seen[0].headers["authorization"] == "Bearer k"


@pytest.mark.parametrize("url", ["grpc://127.0.0.1:8001", "127.0.0.1:3000", "http://"])
def test_bad_upstream_url_is_a_config_error(url: str) -> None:
    with pytest.raises(TGIGatewayError) as info:
        create_tgi_gateway(url)
    assert isinstance(info.value, ConfigError)


def test_bad_idle_timeout_is_a_config_error() -> None:
    with pytest.raises(TGIGatewayError, match="stream_idle_timeout"):
        create_tgi_gateway("http://127.0.0.1:3000", stream_idle_timeout=0)


async def test_repeated_response_headers_survive_the_proxy() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=[("set-cookie", "a=1"), ("set-cookie", "b=2"), ("x-compute-type", "gpu")],
                              stream=httpx.ByteStream(b"ok"))

    gateway = create_tgi_gateway("http://tgi.invalid", transport=httpx.MockTransport(handler))
    async with _gateway_client(gateway) as client:
        response = await client.get("/metrics")
    assert response.headers.get_list("set-cookie") == ["a=1", "b=2"]
    assert response.headers["x-compute-type"] == "gpu" and response.content == b"ok"
