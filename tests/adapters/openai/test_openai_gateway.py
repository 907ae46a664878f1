"""The OpenAI-compatible gateway (``--upstream openai=URL``): the built-in engine as a real upstream, scripted
upstreams (httpx mock transports) for the SSE quirks of other servers and for the failures, and the shared proxy's
request-target rule for both gateways (TGI's too).

The engine runs under uvicorn on loopback in a thread; every request passes its ``eloquent_engine`` controls
through the gateway untouched (a fast one, or a long silence that stands for a queue).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import eloquent_openai.plugin
import httpx
import openai
import pytest
from eloquent_client import EloquentClient
from eloquent_openai.gateway import OpenAIGatewayError, create_openai_gateway
from eloquent_tgi.gateway import create_tgi_gateway
from starlette.applications import Starlette

from eloquent_plugins.cli.app_factory import build_app
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.core.sse_reader import SSEMessage, SSEParser
from eloquent_plugins.engine import Engine, create_engine_app
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.transports.upstream import upstream_kind
from tests.support.servers import eloquent_serve, nginx
from tests.support.tgi_server import run_http3_in_thread, run_in_thread

FAST = {"ttft": 0, "tpot": 0.002}
CONFIG = StreamConfig(keepalive=0.05, resume_grace=30.0, stream_transport="sse")
MESSAGES = [{"role": "user", "content": "Tell me about gateways."}]


@dataclass(frozen=True)
class Servers:
    upstream: str
    gateway: str
    served: str
    """What ``eloquent serve --upstream openai=URL`` hosts: the gateway behind the middleware."""
    engine: Engine


@pytest.fixture(scope="module")
def servers() -> Iterator[Servers]:
    engine_app = create_engine_app()
    pm = create_plugin_manager(load_entry_points=False, plugins=[eloquent_openai.plugin])
    with run_in_thread(engine_app) as upstream, \
            run_in_thread(create_openai_gateway(upstream, CONFIG)) as gateway, \
            run_in_thread(build_app(CONFIG, pm, upstream=f"openai={upstream}")) as served:
        yield Servers(upstream, gateway, served, engine_app.state.engine)


def chat(stream: bool = True, max_tokens: int = 24, **extra: Any) -> dict[str, Any]:
    return {"model": "eloquent-builtin", "messages": MESSAGES, "stream": stream, "max_tokens": max_tokens,
            "eloquent_engine": FAST, **extra}


def data(raw: bytes) -> list[str]:
    return [m.data for m in SSEParser().feed(raw)]


def texts(raw: bytes) -> str:
    out = []
    for payload in data(raw):
        if payload != "[DONE]":
            for choice in json.loads(payload).get("choices") or ():
                out.append((choice.get("delta") or {}).get("content") or choice.get("text") or "")
    return "".join(out)


def without_ids(payloads: list[str]) -> list[Any]:
    """Chunks with the per-request ``id`` and ``created`` taken out: what two runs of the engine share."""
    out = []
    for p in payloads:
        obj = p if p == "[DONE]" else json.loads(p)
        if isinstance(obj, dict):
            obj.pop("id", None)
            obj.pop("created", None)
        out.append(obj)
    return out


# ------------------------------------------------------------------------------------- the engine as upstream


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", chat()),
    ("/v1/chat/completions", chat(stream_options={"include_usage": True})),
    ("/v1/completions", {"prompt": "Every packet", "stream": True, "max_tokens": 16, "eloquent_engine": FAST}),
])
def test_streams_carry_the_upstream_events(servers: Servers, path: str, body: dict[str, Any]) -> None:
    direct, via = (httpx.post(url + path, json=body, timeout=30) for url in (servers.upstream, servers.gateway))
    assert via.status_code == 200 and via.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert without_ids(data(via.content)) == without_ids(data(direct.content))
    assert data(via.content)[-1] == "[DONE]"


@pytest.mark.parametrize(("method", "path", "body"), [
    ("GET", "/v1/models", None),
    ("GET", "/health", None),
    ("GET", "/v1/models?limit=1", None),
    ("POST", "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": -1}),
    ("POST", "/v1/chat/completions", b"{not json"),
    ("GET", "/no-such-route", None),
    ("DELETE", "/v1/models", None),
])
def test_other_routes_are_proxied_unchanged(servers: Servers, method: str, path: str, body: Any) -> None:
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    direct, via = (httpx.request(method, url + path, timeout=30, **kwargs) for url in (servers.upstream,
                                                                                         servers.gateway))
    assert (via.status_code, via.content) == (direct.status_code, direct.content)
    assert via.headers.get("content-type") == direct.headers.get("content-type")


def test_a_rejected_stream_request_is_the_upstreams_error_in_band(servers: Servers) -> None:
    body = {"messages": MESSAGES, "stream": True, "max_tokens": -1}
    direct, via = (httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
                   for url in (servers.upstream, servers.gateway))
    assert direct.status_code == 400 and via.status_code == 200
    assert data(via.content) == [direct.text, "[DONE]"]


def test_a_non_stream_completion_is_proxied(servers: Servers) -> None:
    direct, via = (httpx.post(url + "/v1/chat/completions", json=chat(stream=False), timeout=30).json()
                   for url in (servers.upstream, servers.gateway))
    assert via["choices"] == direct["choices"] and via["usage"] == direct["usage"]


def test_answered_at_once_while_the_upstream_is_silent(servers: Servers) -> None:
    aborted = servers.engine.stats().aborted
    began = time.monotonic()
    body = chat(eloquent_engine={"ttft": 30})
    with httpx.stream("POST", servers.gateway + "/v1/chat/completions", json=body, timeout=30) as response:
        assert response.status_code == 200 and time.monotonic() - began < 5
    # the client left while the engine was still "queued": the engine request is aborted
    assert _wait(lambda: servers.engine.stats().aborted == aborted + 1)


def test_each_upstream_event_is_its_own_message(servers: Servers) -> None:
    body = chat(max_tokens=3, eloquent_engine={"ttft": 0, "tpot": 0.5})
    with httpx.stream("POST", servers.gateway + "/v1/chat/completions", json=body, timeout=30) as response:
        chunks = response.iter_raw()
        first = next(chunks)  # the role chunk; the next token is 0.5 s away
        assert first.startswith(b"data: {") and first.count(b"\n\n") == 1
        rest = b"".join(chunks)
    assert len(data(rest)) == 5  # three tokens, the finish chunk, [DONE]


async def test_a_client_that_leaves_mid_stream_aborts_the_upstream(servers: Servers) -> None:
    stats = servers.engine.stats
    aborted = stats().aborted
    client = openai.AsyncOpenAI(base_url=servers.gateway + "/v1", api_key="-", max_retries=0)
    stream = await client.chat.completions.create(  # type: ignore[call-overload]
        model="eloquent-builtin", messages=MESSAGES, stream=True, max_tokens=5000,
        extra_body={"eloquent_engine": {"ttft": 0, "tpot": 0.01}})
    got = 0
    async for _chunk in stream:
        got += 1
        if got == 3:
            break
    await stream.close()
    await client.close()
    assert await asyncio.to_thread(_wait, lambda: stats().aborted == aborted + 1)
    assert stats().running == 0


def _wait(condition: Any, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# ------------------------------------------------------------------------ served: the gateway behind the host


async def test_openai_sdk_reads_the_same_through_the_served_app(servers: Servers) -> None:
    runs = []
    for url in (servers.upstream, servers.served):
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="-", max_retries=0)
        stream = await client.chat.completions.create(  # type: ignore[call-overload]
            model="eloquent-builtin", messages=MESSAGES, stream=True, max_tokens=40,
            stream_options={"include_usage": True}, extra_body={"eloquent_engine": FAST})
        runs.append([c.model_dump(exclude={"id", "created"}) async for c in stream])
        await client.close()
    assert runs[0] == runs[1] and runs[1][-1]["usage"]["completion_tokens"] == 40


def test_served_events_get_ids_and_keepalives(servers: Servers) -> None:
    body = chat(max_tokens=4, eloquent_engine={"ttft": 0.5, "tpot": 0})
    response = httpx.post(servers.served + "/v1/chat/completions", json=body, timeout=30)
    token = response.headers["x-eloquent-stream"]
    messages = SSEParser().feed(response.content)
    assert [m.id for m in messages] == [f"{token}:{i}" for i in range(len(messages))]
    assert response.content.startswith(b":")  # the host's keep-alive while the engine waited 0.5 s


def test_a_cut_stream_resumes_without_a_second_upstream_request(servers: Servers) -> None:
    stats = servers.engine.stats
    before = stats()
    body = chat(max_tokens=12, eloquent_engine={"ttft": 0, "tpot": 0.05})
    first: list[SSEMessage] = []
    with httpx.stream("POST", servers.served + "/v1/chat/completions", json=body, timeout=30) as response:
        parser = SSEParser()
        for chunk in response.iter_raw():
            first += parser.feed(chunk)
            if len(first) >= 3:
                break
    again = httpx.post(servers.served + "/v1/chat/completions", json=body, timeout=30,
                       headers={"last-event-id": first[2].id or ""})
    rest = SSEParser().feed(again.content)
    whole = [m.data for m in first[:3] + rest]
    direct = httpx.post(servers.upstream + "/v1/chat/completions", json=body, timeout=30)
    assert without_ids(whole) == without_ids(data(direct.content))
    after = stats()
    assert (after.completed, after.aborted) == (before.completed + 2, before.aborted)  # ours + the direct one


@pytest.mark.parametrize("transport", ["eloquent", "h3-stream"])
async def test_http3_delivery_carries_the_same_text(servers: Servers, transport: str) -> None:
    config = StreamConfig(keepalive=0.05, resume_grace=0.0)
    body = chat(max_tokens=30)
    direct = await asyncio.to_thread(httpx.post, servers.upstream + "/v1/chat/completions", json=body, timeout=30)
    with run_http3_in_thread(lambda: EloquentMiddleware(create_openai_gateway(servers.upstream, config), config),
                             config) as port:
        async with EloquentClient(f"https://127.0.0.1:{port}", transport=transport,  # type: ignore[arg-type]
                                  verify=False, timeout=30) as client, \
                client.stream("POST", "/v1/chat/completions", json=body) as stream:
            got = [e.data async for e in stream.events()]
            assert stream.delivery == transport
    assert without_ids(got) == without_ids(data(direct.content))


def test_queued_request_survives_a_proxy_read_timeout(servers: Servers) -> None:
    """nginx gives up on an upstream silent for 3 s; the host's keep-alive (1 s) bridges a 5 s queue."""
    config = StreamConfig(keepalive=1.0, stream_transport="sse")
    pm = create_plugin_manager(load_entry_points=False, plugins=[eloquent_openai.plugin])
    body = chat(max_tokens=6, eloquent_engine={"ttft": 5, "tpot": 0})
    with run_in_thread(build_app(config, pm, upstream=f"openai={servers.upstream}")) as served, \
            nginx(int(served.rsplit(":", 1)[1]), "proxy_read_timeout 3s; proxy_buffering off;") as proxy:
        response = httpx.post(proxy + "/v1/chat/completions", json=body, timeout=30)
    direct = httpx.post(servers.upstream + "/v1/chat/completions", json={**body, "eloquent_engine": FAST}, timeout=30)
    assert response.status_code == 200 and response.content.count(b": keep-alive\n") >= 3
    assert without_ids(data(response.content)) == without_ids(data(direct.content))


def test_eloquent_serve_fronts_another_eloquent_serve() -> None:
    """The CLI as users run it, twice: the built-in engine served with its own ids and keep-alives, and
    ``eloquent serve --upstream openai=`` (the installed entry point) in front; the SDK reads the same."""
    with eloquent_serve("--stream-transport", "sse", "--ttft", "0", "--tpot", "0.002") as engine, \
            eloquent_serve("--stream-transport", "sse", "--upstream", f"openai=http://127.0.0.1:{engine}") as front:
        runs = []
        for port in (engine, front):
            with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0) as client:
                stream = client.chat.completions.create(model="eloquent-builtin", messages=MESSAGES,  # type: ignore
                                                        stream=True, max_tokens=30)
                runs.append([c.model_dump(exclude={"id", "created"}) for c in stream])
    assert runs[0] == runs[1] and len(runs[1]) == 32  # role, 30 tokens, finish


# ------------------------------------------------------------------------------- scripted upstreams: quirks


CHUNK = '{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":' \
        '{"content":"%s"},"finish_reason":%s}]}'
HI, THERE, END = CHUNK % ("Hi", "null"), CHUNK % (" there", "null"), CHUNK % ("", '"stop"')
USAGE = '{"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],' \
        '"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}'
VLLM_ERROR = '{"error":{"message":"boom","type":"InternalServerError","param":null,"code":500}}'


def sse(*payloads: str, sep: str = "data: ", comment: str = "") -> bytes:
    return "".join(f"{comment}{sep}{p}\n\n" for p in payloads).encode()


def scripted(body: bytes, status: int = 200, content_type: str = "text/event-stream",
             seen: list[httpx.Request] | None = None) -> Starlette:
    async def pieces() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 7):  # small reads: events split across chunks
            yield body[i:i + 7]

    def handler(request: httpx.Request) -> httpx.Response:
        if seen is not None:
            seen.append(request)
        return httpx.Response(status, content=pieces(), headers={"content-type": content_type})

    return create_openai_gateway("http://upstream.invalid", transport=httpx.MockTransport(handler))


async def post(gateway: Starlette, path: str = "/v1/chat/completions", **kwargs: Any) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gw") as client:
        return await client.post(path, json=kwargs.pop("json", {"messages": MESSAGES, "stream": True}), **kwargs)


@pytest.mark.parametrize("body", [
    sse(HI, THERE, END, "[DONE]"),
    sse(HI, THERE, END, "[DONE]", sep="data:"),  # no space after the colon
    sse(HI, END, USAGE, "[DONE]"),  # a usage chunk with no choices
    sse(HI, THERE, END),  # no [DONE]: finished is finished
    sse(HI, VLLM_ERROR),  # the upstream's own error event, no [DONE]
    sse(HI, VLLM_ERROR, "[DONE]"),
])
async def test_upstream_framing_is_kept_byte_for_byte(body: bytes) -> None:
    assert (await post(scripted(body))).content == body


async def test_comment_keepalives_pass_as_keepalives() -> None:
    body = sse(HI, THERE, END, "[DONE]", comment=": ping\n\n")
    out = (await post(scripted(body))).content
    assert data(out) == data(body) and out.count(b":\n\n") == 4


async def test_crlf_framing_is_read() -> None:
    body = sse(HI, END, "[DONE]").replace(b"\n", b"\r\n")
    assert data((await post(scripted(body))).content) == [HI, END, "[DONE]"]


async def test_a_stream_that_ends_before_finishing_gets_an_error_event() -> None:
    out = (await post(scripted(sse(HI, THERE)))).content
    assert out == sse(HI, THERE) + sse(
        '{"error":{"message":"upstream stream ended before the generation finished","type":"server_error",'
        '"param":null,"code":502}}', "[DONE]")


@pytest.mark.parametrize(("status", "body", "expected"), [
    (400, VLLM_ERROR.replace("500", "400"), VLLM_ERROR.replace("500", "400")),
    (400, '{"object":"error","message":"too long","type":"BadRequestError","param":null,"code":400}',
     '{"error":{"message":"too long","type":"BadRequestError","param":null,"code":400}}'),
    (503, "overloaded", '{"error":{"message":"overloaded","type":"server_error","param":null,"code":503}}'),
    (422, "", '{"error":{"message":"upstream answered HTTP 422","type":"invalid_request_error","param":null,'
              '"code":422}}'),
])
async def test_a_rejection_after_our_200_is_an_error_event(status: int, body: str, expected: str) -> None:
    out = (await post(scripted(body.encode(), status, "application/json"))).content
    assert out == sse(expected, "[DONE]")


async def test_the_openai_sdk_raises_the_in_band_error() -> None:
    gateway = scripted(sse(HI, VLLM_ERROR, "[DONE]"))
    client = openai.AsyncOpenAI(base_url="http://gw/v1", api_key="-", max_retries=0,
                                http_client=httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway)))
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)  # type: ignore
    got = []
    with pytest.raises(openai.APIError, match="boom"):
        async for chunk in stream:
            got.append(chunk.choices[0].delta.content)
    assert got == ["Hi"]
    await client.close()


async def test_unreachable_upstream_is_an_error_event_and_a_502() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    gateway = create_openai_gateway("http://127.0.0.1:9", transport=httpx.MockTransport(refuse))
    stream = await post(gateway)
    models = await post(gateway, "/v1/models", json=None)
    assert stream.status_code == 200
    error, done = data(stream.content)
    assert json.loads(error)["error"]["message"].startswith("OpenAI upstream http://127.0.0.1:9 unreachable")
    assert json.loads(error)["error"]["code"] == 502 and done == "[DONE]"
    assert models.status_code == 502 and models.json()["error"]["type"] == "server_error"


async def test_a_silent_stream_ends_after_the_idle_timeout_when_one_is_set(servers: Servers) -> None:
    gateway = create_openai_gateway(servers.upstream, stream_idle_timeout=0.3)
    out = await post(gateway, json=chat(eloquent_engine={"ttft": 30}))
    error = json.loads(data(out.content)[0])["error"]
    assert error["message"].startswith("OpenAI upstream stream broke: ReadTimeout") and error["code"] == 502


async def test_oversized_request_is_refused_in_openai_shape() -> None:
    seen: list[httpx.Request] = []
    gateway = create_openai_gateway("http://upstream.invalid", StreamConfig(max_request_bytes=64),
                                    transport=httpx.MockTransport(lambda r: seen.append(r) or httpx.Response(200)))
    response = await post(gateway, json={"messages": MESSAGES * 10, "stream": True})
    assert response.status_code == 413 and response.json()["error"]["type"] == "invalid_request_error"
    assert seen == []


@pytest.mark.parametrize("url", ["grpc://127.0.0.1:8001", "127.0.0.1:8000", "http://", "http://h:8000/v1/"])
def test_bad_upstream_url_is_a_config_error(url: str) -> None:
    with pytest.raises(OpenAIGatewayError) as info:
        create_openai_gateway(url)
    assert isinstance(info.value, ConfigError)


def test_bad_idle_timeout_is_a_config_error() -> None:
    with pytest.raises(OpenAIGatewayError, match="stream_idle_timeout"):
        create_openai_gateway("http://127.0.0.1:8000", stream_idle_timeout=0)


# ------------------------------------------------------------------------ the request target, both gateways


TARGETS = ["/generate_stream", "/v1/models/org%2Fmodel", "/x?a=1&b=%20c+d", "//other.host/x", "/v1/models"]


@pytest.mark.parametrize("make", [create_openai_gateway, create_tgi_gateway], ids=["openai", "tgi"])
@pytest.mark.parametrize("target", TARGETS)
async def test_the_request_target_reaches_the_upstream_unchanged(make: Any, target: str) -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, stream=httpx.ByteStream(b"{}"))

    gateway = make("http://upstream.invalid/prefix", transport=httpx.MockTransport(handler))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gw") as client:
        url = httpx.URL("http://gw").copy_with(raw_path=target.encode())  # sent as is, even "//other.host/x"
        await client.send(client.build_request("POST", url, json={"inputs": "x", "stream": False}))
    assert seen[0].url.host == "upstream.invalid"
    assert seen[0].url.raw_path == b"/prefix" + target.encode()  # no "?" added, no escape undone


async def test_hop_by_hop_headers_stay_here() -> None:
    seen: list[httpx.Request] = []
    gateway = create_openai_gateway("http://upstream.invalid", transport=httpx.MockTransport(
        lambda r: seen.append(r) or httpx.Response(200, stream=httpx.ByteStream(b"{}"))))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gw") as client:
        await client.get("/v1/models", headers={"authorization": "Bearer k", "connection": "x-private",
                                                "x-private": "1", "te": "trailers", "x-request-id": "r1"})
    headers = seen[0].headers
    assert headers["authorization"] == "Bearer k" and headers["x-request-id"] == "r1"
    assert "x-private" not in headers and "te" not in headers


# ---------------------------------------------------------------------------------------------- the plugin


def test_hook_registers_the_openai_upstream() -> None:
    pm = create_plugin_manager(load_entry_points=False, plugins=[eloquent_openai.plugin])
    kind = upstream_kind(pm, "openai")
    assert kind.name == "openai" and "/v1/chat/completions" in kind.description


def test_installed_entry_point_provides_openai() -> None:
    """Needs ``openai = "eloquent_openai.plugin"`` under ``[project.entry-points.eloquent_plugins]``."""
    assert upstream_kind(create_plugin_manager(), "openai").create_app is eloquent_openai.plugin.create_app
