"""The OpenAI gateway against a hostile upstream, a real socket server written here (issue 28):

- an upstream that hangs up (FIN or RST) after reading a POST sees it exactly once, streaming or not, and the
  client gets a 502 JSON or an in-band error event; an idempotent GET is still retried, and a pooled connection
  the upstream closed while idle is still replaced before the POST is written;
- a stream truncated without ``[DONE]`` (``"finish_reason": ""`` on every chunk; ``n=2`` with one choice cut)
  ends with an in-band error, never a normal end, over the bare gateway, SSE through the middleware and HTTP/3
  (the openai SDK's iteration raises ``APIError``); invalid UTF-8 from the upstream is an in-band error.

The upstream's behaviour is chosen per request by an ``x-upstream-mode`` header (the gateway forwards it).
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest
from eloquent_client.httpx_transport import AsyncEloquentTransport
from eloquent_openai.gateway import create_openai_gateway

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.tgi_server import run_http3_in_thread, run_in_thread

CONFIG = StreamConfig(keepalive=0.05, resume_grace=0.0, stream_transport="sse")
MESSAGES = [{"role": "user", "content": "hang up on me"}]


def chunk(content: str, finish: str | None = None, index: int = 0) -> bytes:
    choice = {"index": index, "delta": {"content": content}, "finish_reason": finish}
    return b"data: " + json.dumps({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                                   "choices": [choice]}).encode() + b"\n\n"


BODIES: dict[str, bytes] = {
    # every chunk says "finish_reason": "" and the body ends cleanly, no [DONE]: cut, not finished
    "empty-reason": chunk("Hi", "") + chunk(" there", "") + chunk(" and", ""),
    # n=2: choice 0 finishes, choice 1 is cut mid-way, no [DONE]
    "n2-cut": chunk("A", None, 0) + chunk("B", None, 1) + chunk("", "stop", 0) + chunk(" b", None, 1),
    # n=2, both finish, no [DONE]: complete
    "n2-complete": chunk("A", None, 0) + chunk("B", None, 1) + chunk("", "stop", 0) + chunk("", "length", 1),
    # bytes that are not UTF-8 inside an event
    "bad-utf8": chunk("Hi") + b'data: {"choices":[{"index":0,"delta":{"content":"\xff\xfe"},"finish_reason":null}]}'
                + b"\n\n" + chunk("", "stop") + b"data: [DONE]\n\n",
    # an honest U+FFFD from the model passes unchanged
    "fffd": chunk("\ufffd") + chunk("", "stop") + b"data: [DONE]\n\n",
}


@dataclass
class Upstream:
    """A raw HTTP/1.1 server on a thread: records every request, then behaves as its mode says."""

    port: int = 0
    seen: list[tuple[str, str, str]] = field(default_factory=list)
    """(method, path, x-tag) of every request read in full."""
    closed: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def count(self, tag: str) -> int:
        with self.lock:
            return sum(1 for *_, t in self.seen if t == tag)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
                await reader.readexactly(int(headers.get("content-length", "0")))
                tag, mode = headers.get("x-tag", ""), headers.get("x-upstream-mode", "")
                with self.lock:
                    self.seen.append((method, path, tag))
                    first = sum(1 for *_, t in self.seen if t == tag) == 1
                if mode == "rst" or (mode == "rst-once" and first):
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                if mode == "fin" or (mode == "fin-once" and first):
                    writer.close()
                    return
                if mode in BODIES:
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
                    body = BODIES[mode]
                    for i in range(0, len(body), 40):
                        writer.write(body[i:i + 40])
                        await writer.drain()
                    writer.close()
                    return
                body = json.dumps({"object": "list", "data": [], "tag": tag}).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
                if mode == "close-idle":  # answered with keep-alive, then closed while idle in the pool
                    writer.close()
                    await writer.wait_closed()
                    self.closed.set()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


@pytest.fixture(scope="module")
def upstream() -> Iterator[Upstream]:
    up = Upstream()
    ready = threading.Event()
    box: dict[str, Any] = {}

    async def main() -> None:
        server = await asyncio.start_server(up.handle, "127.0.0.1", 0)
        up.port = server.sockets[0].getsockname()[1]
        box["loop"], box["stop"] = asyncio.get_running_loop(), asyncio.Event()
        ready.set()
        async with server:
            await box["stop"].wait()

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield up
    finally:
        box["loop"].call_soon_threadsafe(box["stop"].set)
        thread.join(10)


def data(raw: bytes) -> list[str]:
    return [line[6:] for line in raw.decode(errors="replace").splitlines() if line.startswith("data: ")]


async def call(gateway: Any, mode: str, *, stream: bool, method: str = "POST", path: str = "/v1/chat/completions",
               **body: Any) -> tuple[httpx.Response, str]:
    tag = uuid.uuid4().hex
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gw",
                                 timeout=30) as client:
        payload = {"model": "m", "messages": MESSAGES, "stream": stream, **body} if method == "POST" else None
        response = await client.request(method, path, json=payload, headers={"x-upstream-mode": mode, "x-tag": tag})
    return response, tag


# ---- never send a POST twice --------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["fin", "rst"])
@pytest.mark.parametrize("stream", [True, False])
async def test_an_upstream_that_hangs_up_after_the_post_sees_it_once(upstream: Upstream, mode: str,
                                                                     stream: bool) -> None:
    response, tag = await call(create_openai_gateway(upstream.url), mode, stream=stream)
    assert upstream.count(tag) == 1  # was 2: the gateway sent the generation again on a fresh connection
    if stream:
        assert response.status_code == 200
        error, done = data(response.content)
        assert json.loads(error)["error"]["code"] == 502 and done == "[DONE]", response.content
        assert "upstream" in json.loads(error)["error"]["message"]
    else:
        assert response.status_code == 502
        assert response.json()["error"]["type"] == "server_error"


@pytest.mark.parametrize("mode", ["fin-once", "rst-once"])
async def test_an_idempotent_request_is_still_retried_once(upstream: Upstream, mode: str) -> None:
    response, tag = await call(create_openai_gateway(upstream.url), mode, stream=False, method="GET",
                               path="/v1/models")
    assert response.status_code == 200 and response.json()["tag"] == tag
    assert upstream.count(tag) == 2


async def test_a_pooled_connection_closed_while_idle_is_replaced_before_writing(upstream: Upstream) -> None:
    gateway = create_openai_gateway(upstream.url)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway), base_url="http://gw",
                                 timeout=30) as client:
        upstream.closed.clear()
        first = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": False},
                                  headers={"x-upstream-mode": "close-idle", "x-tag": "idle-1"})
        assert first.status_code == 200
        assert await asyncio.to_thread(upstream.closed.wait, 10)  # its connection is closed, still in the pool
        second = await client.post("/v1/chat/completions", json={"messages": MESSAGES, "stream": False},
                                   headers={"x-upstream-mode": "ok", "x-tag": "idle-2"})
    assert second.status_code == 200 and second.json()["tag"] == "idle-2"
    assert upstream.count("idle-2") == 1


# ---- a truncated stream never ends complete ---------------------------------------------------------------------
@pytest.mark.parametrize(("mode", "extra"), [("empty-reason", {}), ("n2-cut", {"n": 2})])
async def test_a_truncated_stream_ends_with_an_error_event(upstream: Upstream, mode: str,
                                                           extra: dict[str, Any]) -> None:
    response, _ = await call(create_openai_gateway(upstream.url), mode, stream=True, **extra)
    payloads = data(response.content)
    assert payloads[-1] == "[DONE]"
    error = json.loads(payloads[-2])["error"]
    assert error["code"] == 502 and "ended before the generation finished" in error["message"]
    assert data(BODIES[mode]) == payloads[:-2]  # what came before is relayed unchanged


async def test_every_choice_finished_is_complete_without_done(upstream: Upstream) -> None:
    response, _ = await call(create_openai_gateway(upstream.url), "n2-complete", stream=True, n=2)
    assert data(response.content) == data(BODIES["n2-complete"])  # nothing added


async def test_invalid_utf8_is_an_in_band_error_and_an_honest_fffd_passes(upstream: Upstream) -> None:
    gateway = create_openai_gateway(upstream.url)
    response, _ = await call(gateway, "bad-utf8", stream=True)
    payloads = data(response.content)
    assert payloads[0] == data(BODIES["bad-utf8"])[0] and payloads[-1] == "[DONE]"
    assert "invalid UTF-8" in json.loads(payloads[1])["error"]["message"] and len(payloads) == 3
    honest, _ = await call(gateway, "fffd", stream=True)
    assert honest.content == BODIES["fffd"]


async def sdk_reads(client: openai.AsyncOpenAI, mode: str, **extra: Any) -> list[str]:
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True,  # type: ignore
                                                  extra_headers={"x-upstream-mode": mode}, **extra)
    got: list[str] = []
    async for part in stream:
        got += [c.delta.content or "" for c in part.choices]
    return got


@pytest.mark.parametrize(("mode", "extra"), [("empty-reason", {}), ("n2-cut", {"n": 2}), ("bad-utf8", {})])
async def test_the_openai_sdk_raises_over_sse_and_http3(upstream: Upstream, mode: str,
                                                        extra: dict[str, Any]) -> None:
    make = lambda: EloquentMiddleware(create_openai_gateway(upstream.url, CONFIG), CONFIG)
    with run_in_thread(make()) as served:
        client = openai.AsyncOpenAI(base_url=f"{served}/v1", api_key="-", max_retries=0)
        with pytest.raises(openai.APIError, match="ended before the generation finished|invalid UTF-8"):
            await sdk_reads(client, mode, **extra)
        await client.close()
    with run_http3_in_thread(make, StreamConfig(keepalive=0.05, resume_grace=0.0)) as port:
        transport = AsyncEloquentTransport(transport="eloquent", verify=False)
        client = openai.AsyncOpenAI(base_url=f"https://127.0.0.1:{port}/v1", api_key="-", max_retries=0,
                                    http_client=httpx.AsyncClient(transport=transport, timeout=30))
        with pytest.raises(openai.APIError, match="ended before the generation finished|invalid UTF-8"):
            await sdk_reads(client, mode, **extra)
        await client.close()
    # and a complete stream through the same stack ends normally (the check can pass)
    with run_in_thread(make()) as served:
        client = openai.AsyncOpenAI(base_url=f"{served}/v1", api_key="-", max_retries=0)
        assert "".join(await sdk_reads(client, "n2-complete", n=2)) == "AB"
        await client.close()
