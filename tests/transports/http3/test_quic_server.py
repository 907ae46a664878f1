"""The HTTP/3 front end on loopback (no loss): every scheme delivers the same text, plain requests stay plain,
limits answer with typed errors, and an app failure becomes an in-band error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest
from eloquent_client import (
    ClientError,
    EloquentClient,
    Http3ClientConnection,
    StreamFailed,
)

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.core.hooks.specs import hookimpl
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.core.control import StreamDigest
from eloquent_plugins.transports.http3.server import Http3Server, start_http3_server
from tests.support.streams import chat_maker

MODEL = "eloquent-builtin"
chat = chat_maker(max_tokens=30, model=MODEL)


@pytest.fixture
async def server(h3_engine: Callable[..., Awaitable[Http3Server]]) -> Http3Server:
    return await h3_engine(ttft=0.01, tpot=0.002, record_timings=True)


def url(srv: Http3Server) -> str:
    return f"https://127.0.0.1:{srv.port}"


async def reference_text(srv: Http3Server, body: dict) -> str:
    async with EloquentClient(url(srv), transport="h3-stream", verify=False) as client:
        response = await client.request("POST", "/v1/chat/completions", json={**body, "stream": False})
        assert response.status == 200
        return response.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("transport,scheme,delivery", [
    ("eloquent", None, "eloquent"), ("eloquent", "duplicate", "eloquent"), ("h3-stream", None, "h3-stream"),
    ("eloquent", "stream", "h3-stream"),
])
async def test_every_scheme_delivers_the_non_streaming_text(server: Http3Server, transport: str,
                                                            scheme: str | None, delivery: str) -> None:
    body = chat(60, prompt="schemes")
    expected = await reference_text(server, body)
    async with EloquentClient(url(server), transport=transport, scheme=scheme, verify=False) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body) as s:
            text = await s.text()
            assert s.delivery == delivery
            assert s.rendered[-1].data == "[DONE]"
            assert [e.index for e in s.rendered] == list(range(len(s.rendered)))
            generated = server.generation_times(s.request_id)
    assert text == expected and len(text) > 50
    assert generated is not None and len(generated) == len(s.rendered)


async def test_eloquent_headers_and_digest(server: Http3Server) -> None:
    async with EloquentClient(url(server), verify=False) as client:
        async with client.stream("POST", "/v1/completions", json={"model": MODEL, "prompt": "p", "stream": True,
                                                                  "max_tokens": 20}) as s:
            events = [e async for e in s.events()]
            assert s.headers["eloquent-transport"] == "datagram"
            assert s.headers["eloquent-content-type"].startswith("text/event-stream")
            assert "connection" not in s.headers
            trailer = s.h3._assembler.trailer
    payloads = [e.data.encode() for e in events] + [b""]
    assert trailer is not None and trailer.count == len(payloads)
    assert trailer.sha256 == StreamDigest.of(payloads)


async def test_non_streaming_and_errors_stay_plain(server: Http3Server) -> None:
    async with EloquentClient(url(server), verify=False) as client:
        ok = await client.request("POST", "/v1/chat/completions", json=chat(stream=False),
                                  headers={"eloquent-transport": "datagram"})
        assert ok.status == 200 and "eloquent-transport" not in ok.headers
        missing = await client.request("GET", "/nope")
        assert missing.status == 404 and missing.json()["error"]["code"] == "not_found"
        with pytest.raises(ClientError, match="HTTP 400"):
            async with client.stream("POST", "/v1/chat/completions", json={"model": MODEL}):
                pass


async def test_unknown_scheme_is_a_400(server: Http3Server) -> None:
    async with EloquentClient(url(server), verify=False) as client:
        r = await client.request("POST", "/v1/chat/completions", json=chat(),
                                 headers={"eloquent-transport": "datagram", "eloquent-scheme": "carrier-pigeon"})
    assert r.status == 400 and r.json()["error"]["code"] == "invalid_eloquent_scheme"


async def test_request_body_limit() -> None:
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.0))
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig(max_request_bytes=1000))
    try:
        async with EloquentClient(url(srv), verify=False) as client:
            big = await client.request("POST", "/v1/chat/completions", json=chat(prompt="x" * 5000))
            assert big.status == 413 and big.json()["error"]["code"] == "request_too_large"
            conn = await client.connection()
            # No content-length: the limit is enforced on the bytes as they arrive.
            stream = await conn.request("POST", "/v1/chat/completions", body=b"y" * 3000, content_length=False)
            await stream.wait_headers(5)
            assert stream.status == 413
            small = await client.request("POST", "/v1/chat/completions", json=chat(stream=False))
            assert small.status == 200
    finally:
        await srv.close()


async def test_concurrent_stream_limit_per_connection() -> None:
    app = create_engine_app(EngineConfig(ttft=0.5, tpot=0.01))
    config = StreamConfig(limits=Limits(max_streams=2))
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=config)
    try:
        async with EloquentClient(url(srv), verify=False) as client:
            conn = await client.connection()
            body = json.dumps(chat(5)).encode()
            streams = [await conn.request("POST", "/v1/chat/completions", body=body, eloquent=True,
                                          headers=[("eloquent-transport", "datagram")]) for _ in range(3)]
            for s in streams:
                await s.wait_headers(5)
            assert sorted(s.status for s in streams) == [200, 200, 503]
            for s in streams[:2]:
                assert [e async for e in s.events()][-1].data == "[DONE]"
    finally:
        await srv.close()


async def test_oversized_event_ends_the_stream_with_an_in_band_error() -> None:
    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: small\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: " + b"z" * 5000 + b"\n\n", "more_body": True})

    config = StreamConfig(limits=Limits(max_event_bytes=1000))
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=config)
    try:
        # An OpenAI route: the in-band error takes the route codec's shape (tests/transports/http3/test_quic_codec_errors.py).
        async with EloquentClient(url(srv), verify=False) as client, \
                client.stream("POST", "/v1/completions", json={}) as s:
            events = [e async for e in s.events()]
        assert [e.data for e in events[:1]] == ["small"]
        assert events[-1].kind == "error" and "max_event_bytes" in events[-1].error["message"]
    finally:
        await srv.close()


async def test_app_crash_mid_stream_is_an_in_band_error_on_both_paths() -> None:
    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"connection", b"keep-alive")]})
        await send({"type": "http.response.body", "body": b'data: {"choices":[{"text":"a"}]}\n\n',
                    "more_body": True})
        raise RuntimeError("boom")

    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig())
    try:
        for transport in ("eloquent", "h3-stream"):
            async with EloquentClient(url(srv), transport=transport, verify=False) as client:
                async with client.stream("POST", "/", json={}) as s:
                    with pytest.raises(StreamFailed):
                        await s.text()
                    assert s.rendered[0].text == "a"
    finally:
        await srv.close()


async def test_abandoned_request_aborts_the_engine(server: Http3Server) -> None:
    async with EloquentClient(url(server), verify=False) as client:
        async with client.stream("POST", "/v1/chat/completions", json=chat(2000)) as s:
            async for _ in s.events():
                break
        for _ in range(200):
            stats = (await client.request("GET", "/v1/engine/stats")).json()
            if stats["aborted"] >= 1 and stats["running"] == 0:
                break
            await asyncio.sleep(0.02)
    assert stats["aborted"] >= 1 and stats["running"] == 0


async def test_hooks_see_and_transform_events(server: Http3Server) -> None:
    seen: list[tuple[str, bytes]] = []

    class Upper:
        @hookimpl
        def eloquent_transform_event(self, stream, event):  # type: ignore[no-untyped-def]
            return event.payload.replace(b"[DONE]", b"[FIN]")

        @hookimpl
        def eloquent_stream_end(self, stream, reason):  # type: ignore[no-untyped-def]
            seen.append((stream.transport, reason.encode()))

    pm = create_plugin_manager(load_entry_points=False, plugins=[Upper()])
    last = await last_events(create_engine_app(EngineConfig(ttft=0.0, tpot=0.001)), pm)
    assert last == {"eloquent": "[FIN]", "h3-stream": "[FIN]"}
    assert seen == [("eloquent", b"complete"), ("h3", b"complete")]


async def last_events(app, pm) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Serve ``app`` with plugins ``pm`` and stream one chat per transport: the last event's data of each."""
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig(), plugin_manager=pm)
    last: dict[str, str] = {}
    try:
        for transport in ("eloquent", "h3-stream"):
            async with EloquentClient(url(srv), transport=transport, verify=False) as client:
                async with client.stream("POST", "/v1/chat/completions", json=chat(5)) as s:
                    last[transport] = [e async for e in s.events()][-1].data
        await asyncio.sleep(0.2)  # an Eloquent stream's end hook waits for the final ack
    finally:
        await srv.close()
    return last


async def test_configured_certificate_and_verification(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from eloquent_plugins.transports.http3.certs import generate_dev_certificate

    pair = generate_dev_certificate(tmp_path)
    app = create_engine_app(EngineConfig(ttft=0.0, tpot=0.0))
    config = StreamConfig(certfile=str(pair.certfile), keyfile=str(pair.keyfile))
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=config)
    try:
        async with EloquentClient(f"https://localhost:{srv.port}", verify=str(pair.certfile)) as client:
            assert (await client.request("GET", "/health")).status == 200
        with pytest.raises(ClientError):
            # Default verification (system CAs) must refuse the self-signed certificate.
            await Http3ClientConnection.connect("127.0.0.1", srv.port, verify=True, timeout=3)
    finally:
        await srv.close()


async def test_keepalive_during_silence_on_both_paths() -> None:
    async def app(scope, receive, send):  # type: ignore[no-untyped-def]
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
        await asyncio.sleep(1.0)  # a long prefill or a queue: nothing to send
        await send({"type": "http.response.body", "body": b"data: two\n\n", "more_body": False})

    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig(keepalive=0.2))
    try:
        for transport in ("eloquent", "h3-stream"):
            async with EloquentClient(url(srv), transport=transport, verify=False) as client:
                async with client.stream("POST", "/", json={}) as s:
                    assert [e.data for e in [e async for e in s.events()]] == ["one", "two"]
                    h3 = s.h3
                    if transport == "eloquent":
                        assert h3._assembler.receiver.stats.keepalives >= 2
                    else:
                        assert h3._sse.comments_seen >= 2
    finally:
        await srv.close()


async def test_hooks_fire_once_when_the_hosted_app_has_the_middleware() -> None:
    """``eloquent serve`` and the vLLM plugin host an app wrapped in ``EloquentMiddleware``: the front end and the
    middleware would both fire the stream hooks, and a transform would apply twice. The middleware claims them
    (``HOOKS_EXTENSION``) and reports the front end's transport label."""
    from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

    starts: list[str] = []
    ends: list[tuple[str, str]] = []

    class Mark:
        @hookimpl
        def eloquent_stream_start(self, stream):  # type: ignore[no-untyped-def]
            starts.append(stream.transport)

        @hookimpl
        def eloquent_transform_event(self, stream, event):  # type: ignore[no-untyped-def]
            return event.payload + b"!" if event.payload.startswith(b"[DONE]") else None

        @hookimpl
        def eloquent_stream_end(self, stream, reason):  # type: ignore[no-untyped-def]
            ends.append((stream.transport, reason))

    pm = create_plugin_manager(load_entry_points=False, plugins=[Mark()])
    app = EloquentMiddleware(create_engine_app(EngineConfig(ttft=0.0, tpot=0.001)), StreamConfig(), plugin_manager=pm)
    assert await last_events(app, pm) == {"eloquent": "[DONE]!", "h3-stream": "[DONE]!"}  # once, not "[DONE]!!"
    assert sorted(starts) == ["eloquent", "h3"]
    assert sorted(ends) == [("eloquent", "complete"), ("h3", "complete")]
