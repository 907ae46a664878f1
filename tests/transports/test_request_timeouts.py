"""Slowloris on the request side and per-client stream limits (docs/SECURITY.md, "HTTP requests").

A real ``eloquent serve`` (subprocess, 1 s header and body timeouts, one live stream per client) read with raw
sockets; the HTTP/3 front end with a trickled body; the middleware's per-client bookkeeping driven directly so
that every exit path (end, refusal, client gone, app exception) is shown to give its slot back. Every wait is
bounded, so a hang fails the test.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from eloquent_client import EloquentClient, H3Stream

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.request_timeouts import (
    BodyTimeoutMiddleware,
    header_timeout_protocol,
)
from eloquent_plugins.transports.http3.server import start_http3_server
from eloquent_plugins.transports.sse.ids import client_key
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from tests.support.servers import eloquent_serve
from tests.support.streams import chat_maker

ELOQUENT = str(Path(sys.executable).with_name("eloquent"))
MODELS = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"


chat = chat_maker(max_tokens=4)


@pytest.fixture(scope="module")
def port() -> Iterator[int]:
    """``eloquent serve`` with 1 s header and body timeouts and one live stream per client (uvicorn's own
    keep-alive timeout stays at its default, 5 s)."""
    with eloquent_serve("--stream-transport", "sse", "--header-timeout", "1", "--body-timeout", "1",
                        "--max-streams-per-client", "1", "--ttft", "0.05", "--tpot", "0.03",
                        "--log-level", "warning") as port:
        yield port


async def read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def trickle(writer: asyncio.StreamWriter, data: bytes, gap: float) -> None:
    """Send ``data`` one byte at a time, ``gap`` seconds apart, until it is sent or the server closes."""
    with contextlib.suppress(ConnectionError):
        for byte in data:
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(gap)


def assert_timeout_error(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 408, (status, body)
    assert headers["connection"] == "close" and headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert error["type"] == "request_timeout" and error["code"] == 408 and error["message"]


async def engine_stats(client: httpx.AsyncClient) -> int:
    """Every request the built-in engine has ever started (running, completed, aborted or failed)."""
    stats = (await client.get("/v1/engine/stats")).json()
    return sum(stats.values())


# -- config -----------------------------------------------------------------------------------------------------


def test_config_fields_env_and_validation() -> None:
    default = StreamConfig()
    assert (default.header_timeout, default.body_timeout, default.max_streams_per_client) == (30.0, 30.0, 0)
    cfg = StreamConfig.from_env({"ELOQUENT_HEADER_TIMEOUT": "2.5", "ELOQUENT_BODY_TIMEOUT": "0",
                                 "ELOQUENT_MAX_STREAMS_PER_CLIENT": "3"})
    assert (cfg.header_timeout, cfg.body_timeout, cfg.max_streams_per_client) == (2.5, 0.0, 3)
    for name, raw in (("HEADER_TIMEOUT", "soon"), ("HEADER_TIMEOUT", "-1"), ("BODY_TIMEOUT", "nan"),
                      ("MAX_STREAMS_PER_CLIENT", "-2"), ("MAX_STREAMS_PER_CLIENT", "1.5")):
        with pytest.raises(ConfigError):
            StreamConfig.from_env({f"ELOQUENT_{name}": raw})
    assert header_timeout_protocol(2.0).header_timeout == 2.0
    assert header_timeout_protocol(2.0) is header_timeout_protocol(2.0)
    with pytest.raises(ValueError):
        header_timeout_protocol(-1.0)


def test_serve_rejects_negative_timeouts() -> None:
    for flag, value in (("--header-timeout", "-1"), ("--body-timeout", "x"), ("--max-streams-per-client", "-1")):
        result = subprocess.run([ELOQUENT, "serve", flag, value], capture_output=True, timeout=60, check=False)
        assert result.returncode == 2 and flag.encode() in result.stderr


# -- headers ----------------------------------------------------------------------------------------------------


async def test_trickled_or_missing_headers_get_408_and_close_while_others_are_served(port: int) -> None:
    async def slow_client(data: bytes) -> tuple[float, tuple[int, dict[str, str], bytes], bytes]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        opened = time.monotonic()
        sender = asyncio.create_task(trickle(writer, data, 0.3))
        try:
            response = await asyncio.wait_for(read_response(reader), 8)
            elapsed = time.monotonic() - opened
            rest = await asyncio.wait_for(reader.read(), 5)  # b"": the server closed the connection
        finally:
            sender.cancel()
            writer.close()
        return elapsed, response, rest

    # Bytes of a request line every 0.3 s (it would take ~10 s), and a connection that sends nothing at all.
    slow = asyncio.create_task(slow_client(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"))
    silent = asyncio.create_task(slow_client(b""))
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        for _ in range(3):  # meanwhile other connections are served as usual
            assert (await client.get("/v1/models")).status_code == 200
            await asyncio.sleep(0.2)
    for task in (slow, silent):
        elapsed, response, rest = await asyncio.wait_for(task, 15)
        assert_timeout_error(*response)
        assert json.loads(response[2])["error"]["message"] == "request headers not received within 1 s"
        assert rest == b""
        assert 0.8 <= elapsed <= 4.0, elapsed


async def test_idle_keepalive_is_uvicorns_rule_and_the_next_request_gets_its_own_deadline(port: int) -> None:
    async def idle_until_closed() -> float:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(MODELS)
            assert (await asyncio.wait_for(read_response(reader), 5))[0] == 200
            done = time.monotonic()
            assert await asyncio.wait_for(reader.read(), 15) == b""  # closed without a 408
            return time.monotonic() - done
        finally:
            writer.close()

    keepalive = asyncio.create_task(idle_until_closed())
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(MODELS)
        assert (await asyncio.wait_for(read_response(reader), 5))[0] == 200
        await asyncio.sleep(2.5)  # idle longer than the header timeout (1 s), shorter than keep-alive (5 s)
        writer.write(MODELS)
        assert (await asyncio.wait_for(read_response(reader), 5))[0] == 200
        # A request that starts but never completes its headers is cut its header timeout after its first byte.
        writer.write(b"GET /v1/mod")
        started = time.monotonic()
        response = await asyncio.wait_for(read_response(reader), 6)
        assert_timeout_error(*response)
        assert 0.8 <= time.monotonic() - started <= 4.0
        assert await asyncio.wait_for(reader.read(), 5) == b""
    finally:
        writer.close()
    idle = await asyncio.wait_for(keepalive, 20)
    assert 4.0 <= idle <= 10.0, idle  # uvicorn's timeout_keep_alive (5 s) closed it, not the 1 s header timer


# -- bodies -----------------------------------------------------------------------------------------------------


async def test_trickled_body_gets_408_and_the_engine_never_starts(port: int) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        before = await engine_stats(client)
        body = json.dumps(chat()).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                         b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:10])
            started = time.monotonic()
            sender = asyncio.create_task(trickle(writer, body[10:], 2.0))  # slower than the 1 s body timeout
            response = await asyncio.wait_for(read_response(reader), 8)
            elapsed = time.monotonic() - started
            assert_timeout_error(*response)
            assert json.loads(response[2])["error"]["message"] == "request body not received: no data for 1 s"
            assert await asyncio.wait_for(reader.read(), 5) == b""
            sender.cancel()
        finally:
            writer.close()
        assert 0.8 <= elapsed <= 4.0, elapsed
        assert await engine_stats(client) == before  # the engine never saw the request

        # A body that keeps coming (a chunk every 0.3 s, 2+ s in all) is not cut: the timeout is per chunk.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            body = json.dumps(chat(2, stream=False)).encode()
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                         b"\r\nContent-Length: %d\r\n\r\n" % len(body))
            for i in range(0, len(body), 10):
                writer.write(body[i:i + 10])
                await writer.drain()
                await asyncio.sleep(0.3)
            status, _, answer = await asyncio.wait_for(read_response(reader), 10)
            assert status == 200 and json.loads(answer)["choices"][0]["message"]["content"]
        finally:
            writer.close()


async def test_body_timeout_after_the_response_started_cuts_without_a_408() -> None:
    received: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"early", "more_body": True})
        while True:
            message = await receive()
            received.append(message["type"])
            if message["type"] == "http.disconnect":
                break
        await send({"type": "http.response.body", "body": b"late", "more_body": False})

    client_messages = [{"type": "http.request", "body": b"a", "more_body": True}]

    async def receive() -> dict[str, Any]:
        if client_messages:
            return client_messages.pop(0)
        await asyncio.Event().wait()  # the client sends nothing more
        raise AssertionError("unreachable")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "headers": [], "client": ("127.0.0.1", 1)}
    await asyncio.wait_for(BodyTimeoutMiddleware(app, 0.2)(scope, receive, send), 5)
    assert received == ["http.request", "http.disconnect"]
    assert [m.get("body") for m in sent] == [None, b"early"]  # no 408, and nothing after the cut


async def test_trickled_body_over_http3_gets_408_and_the_connection_goes_on() -> None:
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.001))
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig(body_timeout=1.0))
    try:
        async with EloquentClient(f"https://127.0.0.1:{srv.port}", verify=False) as client:
            conn = await client.connection()
            protocol = conn._protocol
            body = json.dumps(chat()).encode()
            stream_id = protocol._quic.get_next_available_stream_id()
            stream = H3Stream(protocol, stream_id, eloquent=False, limits=conn.limits)
            protocol.streams[stream_id] = stream
            protocol.h3.send_headers(stream_id, [
                (b":method", b"POST"), (b":scheme", b"https"), (b":authority", conn.authority.encode()),
                (b":path", b"/v1/chat/completions"), (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode())], end_stream=False)
            protocol.h3.send_data(stream_id, body[:10], end_stream=False)
            protocol.transmit()
            started = time.monotonic()
            await stream.wait_headers(8)
            elapsed = time.monotonic() - started
            assert stream.status == 408
            error = json.loads(await asyncio.wait_for(stream.read(), 5))["error"]
            assert error["type"] == "request_timeout" and error["code"] == 408
            assert 0.8 <= elapsed <= 4.0, elapsed
            stats = app.state.engine.stats()
            assert (stats.running, stats.completed, stats.aborted, stats.failed) == (0, 0, 0, 0)
            # The same connection still serves a request that sends its body.
            ok = await asyncio.wait_for(client.request("POST", "/v1/chat/completions", json=chat(stream=False)), 10)
            assert ok.status == 200
    finally:
        await asyncio.wait_for(srv.close(), 10)


# -- per-client stream limit ------------------------------------------------------------------------------------


async def new_stream_when_allowed(client: httpx.AsyncClient, deadline: float = 3.0) -> httpx.Response:
    """A stream request, retried while it gets 429 (the server frees a slot just after the end is sent)."""
    until = time.monotonic() + deadline
    while True:
        response = await client.post("/v1/chat/completions", json=chat())
        if response.status_code != 429 or time.monotonic() > until:
            return response
        await asyncio.sleep(0.05)


async def test_per_client_stream_limit_429_then_allowed_once_one_ends(port: int) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
        async with client.stream("POST", "/v1/chat/completions", json=chat(60)) as first:  # ~2 s of tokens
            assert first.status_code == 200
            chunks = first.aiter_bytes()
            await asyncio.wait_for(chunks.__anext__(), 5)  # it is live
            second = await client.post("/v1/chat/completions", json=chat())
            assert second.status_code == 429 and second.headers["retry-after"] == "1"
            error = second.json()["error"]
            assert error["code"] == "rate_limit_exceeded" and "at most 1 per client" in error["message"]
            # Another caller (its own credentials) is counted on its own.
            other = await client.post("/v1/chat/completions", json=chat(), headers={"Authorization": "Bearer b"})
            assert other.status_code == 200 and b"[DONE]" in other.content
            # Plain requests are not streams: not counted.
            assert (await client.post("/v1/chat/completions", json=chat(stream=False))).status_code == 200
            async for _ in chunks:
                pass
        again = await asyncio.wait_for(new_stream_when_allowed(client), 10)
        assert again.status_code == 200 and b"[DONE]" in again.content

        # A client that leaves mid-stream frees its slot (its stream may still run for the resume grace).
        async with client.stream("POST", "/v1/chat/completions", json=chat(200)) as leaving:
            assert leaving.status_code == 200
            await asyncio.wait_for(leaving.aiter_bytes().__anext__(), 5)
        after = await asyncio.wait_for(new_stream_when_allowed(client), 10)
        assert after.status_code == 200 and b"[DONE]" in after.content


class FakeClient:
    """The server side of one request, scripted: the body, then nothing until ``leave()``."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self._gone = asyncio.Event()
        self._body_sent = False
        self.started = asyncio.Event()

    async def receive(self) -> dict[str, Any]:
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.start":
            self.started.set()

    def leave(self) -> None:
        self._gone.set()

    @property
    def status(self) -> int | None:
        return next((m["status"] for m in self.sent if m["type"] == "http.response.start"), None)


def stream_app(gate: asyncio.Event, seen: list[str], *, fail: bool = False) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        if fail:
            raise RuntimeError("engine crashed")
        waiter = asyncio.ensure_future(receive())
        opened = asyncio.ensure_future(gate.wait())
        done, _ = await asyncio.wait({waiter, opened}, return_when=asyncio.FIRST_COMPLETED)
        if waiter in done:
            seen.append(waiter.result()["type"])
        waiter.cancel()
        opened.cancel()
        await send({"type": "http.response.body", "body": b"data: y\n\n", "more_body": False})

    return app


def scope_for(client: str = "10.0.0.1") -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions", "query_string": b"", "headers": [],
            "client": (client, 5000)}


async def test_per_client_slots_are_returned_on_every_exit_path() -> None:
    gate, seen = asyncio.Event(), []
    mw = EloquentMiddleware(stream_app(gate, seen), StreamConfig(max_streams_per_client=1, keepalive=0))
    first = FakeClient()
    task = asyncio.create_task(mw(scope_for(), first.receive, first.send))
    await asyncio.wait_for(first.started.wait(), 5)
    assert first.status == 200 and mw.client_streams == {"ip:10.0.0.1": 1}

    # Refused: 429 with Retry-After, and its app is told the client left (the engine request stops).
    refused = FakeClient()
    await asyncio.wait_for(mw(scope_for(), refused.receive, refused.send), 5)
    assert refused.status == 429 and (b"retry-after", b"1") in refused.sent[0]["headers"]
    assert [m.get("body", b"")[:1] for m in refused.sent] == [b"", b"{"]  # the 429 only, nothing of the app
    assert seen == ["http.disconnect"] and mw.metrics.streams_refused == 1
    assert mw.client_streams == {"ip:10.0.0.1": 1}

    # Another address is counted on its own.
    elsewhere = FakeClient()
    other = asyncio.create_task(mw(scope_for("10.0.0.2"), elsewhere.receive, elsewhere.send))
    await asyncio.wait_for(elsewhere.started.wait(), 5)
    assert elsewhere.status == 200 and mw.client_streams == {"ip:10.0.0.1": 1, "ip:10.0.0.2": 1}

    # The client leaves: its slot is free at once, though the stream may run on for the resume grace.
    first.leave()
    for _ in range(100):
        if "ip:10.0.0.1" not in mw.client_streams:
            break
        await asyncio.sleep(0.01)
    assert mw.client_streams == {"ip:10.0.0.2": 1} and not task.done()

    # The stream ends normally: slot returned.
    gate.set()
    await asyncio.wait_for(asyncio.gather(task, other), 10)
    assert mw.client_streams == {}

    # The app raises after the 200: turned into an in-band error, and the slot is still returned.
    crashing = EloquentMiddleware(stream_app(gate, seen, fail=True), StreamConfig(max_streams_per_client=1,
                                                                                  keepalive=0))
    crashed = FakeClient()
    await asyncio.wait_for(crashing(scope_for(), crashed.receive, crashed.send), 5)
    assert crashed.status == 200 and crashing.client_streams == {}
    again = FakeClient()
    await asyncio.wait_for(crashing(scope_for(), again.receive, again.send), 5)
    assert again.status == 200 and crashing.client_streams == {}


async def test_credentials_name_the_client_and_unlimited_counts_nothing() -> None:
    gate, seen = asyncio.Event(), []
    gate.set()
    mw = EloquentMiddleware(stream_app(gate, seen), StreamConfig(keepalive=0))
    one = FakeClient()
    await asyncio.wait_for(mw(scope_for(), one.receive, one.send), 5)
    assert one.status == 200 and mw.client_streams == {}

    keyed = {**scope_for(), "headers": [(b"authorization", b"Bearer k")]}
    assert client_key(keyed, None).startswith("id:") and client_key(keyed, None) != client_key(
        {**keyed, "headers": [(b"authorization", b"Bearer j")]}, None)
    assert client_key(scope_for(), None) == "ip:10.0.0.1"
    assert client_key({**scope_for(), "client": None}, None) == "ip:unknown"
    assert client_key(scope_for(), lambda scope: "tenant-7").startswith("id:")
