"""The SSE path's parts on their own: connection coalescing / merging / send timeout / keep-alive frame, the
receive relay, event ids and identity, header rewriting."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.transports.resume.base import StreamMeta
from eloquent_plugins.transports.resume.local import LocalSource
from eloquent_plugins.core.keepalive import SSE_COMMENT_FRAME as KEEPALIVE_COMMENT
from eloquent_plugins.transports.sse.connection import Connection
from eloquent_plugins.transports.sse.headers import is_event_stream, stream_headers
from eloquent_plugins.core.protocol import BadEventId, parse_event_id
from eloquent_plugins.transports.sse.ids import identity_hash, new_token, resume_request
from eloquent_plugins.transports.sse.merge import merge_openai
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.transports.sse.receive import ReceiveRelay
from eloquent_plugins.transports.resume.log import EventsGone, StreamLog

META = StreamMeta("s-1", "", 200, ())


def chunk(text: str, *, index: int = 0, finish: str | None = None, cid: str = "c1") -> bytes:
    obj = {"id": cid, "object": "chat.completion.chunk", "choices": [
        {"index": index, "delta": {"content": text} if finish is None else {}, "logprobs": None,
         "finish_reason": finish}]}
    return json.dumps(obj, separators=(",", ":")).encode()


def frame(i: int, payload: bytes) -> bytes:
    return b"id: tok:%d\ndata: %s\n\n" % (i, payload)


class GatedSend:
    """A client whose first write blocks until released (a slow reader)."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.gate = asyncio.Event()
        self.first = True

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            self.writes.append(message.get("body", b""))
            if self.first:
                self.first = False
                await self.gate.wait()


async def test_queued_events_go_out_in_one_write_and_deltas_merge():
    log = StreamLog()
    send = GatedSend()
    metrics = StreamMetrics()
    conn = Connection(send, LocalSource(META, log), 0, policy=KeepAlivePolicy(0), send_timeout=0, metrics=metrics,
                      merge=merge_openai)
    task = conn.start()
    log.append(frame(0, chunk("a")))
    await asyncio.sleep(0.01)  # the first write is now blocked in the slow client
    for i, text in enumerate(["b", "c", "d"], start=1):
        log.append(frame(i, chunk(text)))
    log.append(frame(4, chunk("", finish="stop")))
    log.close("complete")
    send.gate.set()
    assert await task == "complete"
    assert len(send.writes) == 3  # the first event, everything queued behind it, the end of the body
    messages = SSEParser().feed(send.writes[1])
    assert [m.id for m in messages] == ["tok:3", "tok:4"]  # the merged chunk carries its last event's id
    assert json.loads(messages[0].data)["choices"][0]["delta"]["content"] == "bcd"
    assert metrics.events_merged == 2 and metrics.writes == 2


def test_merge_keeps_anything_it_cannot_merge_byte_for_byte():
    role = b'{"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}'
    frames = [frame(0, role), frame(1, chunk("x")), frame(2, chunk("y", cid="other")), frame(3, b"[DONE]"),
              b"id: tok:4\nevent: foo\ndata: {}\n\n"]
    out, merged = merge_openai(frames)
    assert out == frames and merged == 0


async def test_without_coalescing_each_event_is_its_own_write():
    log = StreamLog()
    send = GatedSend()
    conn = Connection(send, LocalSource(META, log), 0, policy=KeepAlivePolicy(0), send_timeout=0,
                      metrics=StreamMetrics(), coalesce=False)
    task = conn.start()
    log.append(frame(0, b"0"))
    await asyncio.sleep(0.01)
    for i in range(1, 4):
        log.append(frame(i, b"%d" % i))
    log.close("complete")
    send.gate.set()
    await task
    assert send.writes[:-1] == [frame(i, b"%d" % i) for i in range(4)]


async def test_client_that_stops_reading_is_cut_after_send_timeout():
    log = StreamLog()
    send = GatedSend()  # never released
    metrics = StreamMetrics()
    conn = Connection(send, LocalSource(META, log), 0, policy=KeepAlivePolicy(0), send_timeout=0.2, metrics=metrics)
    conn.start()
    log.append(frame(0, b"x"))
    assert await asyncio.wait_for(conn.finished(), 5) == "send_timeout"
    assert metrics.send_timeouts == 1


async def test_keepalive_is_a_lone_comment_line_on_idle_only():
    log = StreamLog()
    writes: list[bytes] = []

    async def send(message: dict[str, Any]) -> None:
        writes.append(message.get("body", b""))

    metrics = StreamMetrics()
    conn = Connection(send, LocalSource(META, log), 0, policy=KeepAlivePolicy(0.1), send_timeout=0, metrics=metrics)
    task = conn.start()
    await asyncio.sleep(0.35)
    log.append(frame(0, b"x"))
    log.close("complete")
    await task
    assert KEEPALIVE_COMMENT == b": keep-alive\n" and writes[0] == KEEPALIVE_COMMENT
    assert metrics.keepalives >= 1 and writes[-2:] == [frame(0, b"x"), b""]


def test_stream_log_trims_oldest_and_reports_gone():
    log = StreamLog(max_events=8, max_bytes=1 << 20)
    for i in range(20):
        log.append(b"%d" % i)
    assert log.next_index == 20 and log.base > 0 and len(log.frames) <= 8
    with pytest.raises(EventsGone):
        log.take(0)
    assert log.take(19) == [b"19"]


async def test_relay_forwards_every_message_and_holds_the_disconnect():
    messages = [{"type": "http.request", "body": b"a", "more_body": True},
                {"type": "http.request", "body": b"b", "more_body": False}, {"type": "http.disconnect"}]
    queue: asyncio.Queue = asyncio.Queue()
    for m in messages:
        queue.put_nowait(m)
    relay = ReceiveRelay(queue.get)
    assert await relay.receive() == messages[0]
    relay.hold()
    relay.watch()  # the pump reads on; the app still gets every message in order
    assert await relay.receive() == messages[1]
    gone = []
    relay.on_gone(lambda: gone.append(True))
    waiter = asyncio.ensure_future(relay.receive())
    await asyncio.sleep(0.05)
    assert gone == [True] and not waiter.done()  # held back from the app
    relay.release()
    assert await asyncio.wait_for(waiter, 1) == {"type": "http.disconnect"}
    relay.close()


def test_event_ids_and_identity():
    token = new_token()
    assert len(token) == 22 and token != new_token()
    assert parse_event_id(f"{token}:41").after == 41 and parse_event_id(token).after == -1
    for bad in ("", "short:1", f"{token}:x", f"{token}:-5", "a b c d e f g h i j k:1", f"{token}:" + "9" * 30):
        with pytest.raises(BadEventId):
            parse_event_id(bad)
    alice = {"headers": [(b"authorization", b"Bearer alice")], "query_string": b""}
    bob = {"headers": [(b"authorization", b"Bearer bob")], "query_string": b""}
    assert identity_hash(alice, None) != identity_hash(bob, None)
    assert identity_hash(alice, lambda s: "team-1") == identity_hash(bob, lambda s: "team-1")
    assert resume_request({"headers": [], "query_string": f"x=1&last_event_id={token}:3".encode()}) == f"{token}:3"


def test_headers_drop_hop_by_hop_and_stop_buffering():
    src = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"Connection", b"keep-alive"),
           (b"content-length", b"10"), (b"x-request-id", b"r1"), (b"cache-control", b"no-store")]
    out = dict(stream_headers(src, token="T" * 22))
    assert b"connection" not in out and b"content-length" not in out
    assert out[b"cache-control"] == b"no-store" and out[b"x-accel-buffering"] == b"no"
    assert out[b"x-request-id"] == b"r1" and out[b"x-eloquent-stream"] == b"T" * 22
    assert is_event_stream(src) and not is_event_stream([(b"content-type", b"application/json")])
    assert not is_event_stream([(b"content-type", b"text/event-stream"), (b"content-encoding", b"gzip")])


async def test_apps_that_fail_before_streaming_keep_their_status():
    """No early start for non-SSE answers: a 400 stays a 400, an exception before the start propagates."""

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["path"] == "/boom":
            raise RuntimeError("before start")
        await send({"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: no\n\n"})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    mw = EloquentMiddleware(app, StreamConfig())
    scope = {"type": "http", "method": "POST", "path": "/x", "headers": [], "query_string": b""}
    await mw(scope, receive, send)
    assert sent == [
        {"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"text/event-stream")]},
        {"type": "http.response.body", "body": b"data: no\n\n"}]
    with pytest.raises(RuntimeError):
        await mw({**scope, "path": "/boom"}, receive, send)


async def test_an_unreachable_resume_store_degrades_to_plain_streaming():
    from eloquent_plugins.transports.resume.redis_store import RedisStore
    from tests.support.servers import free_port

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: a\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b"data: b\n\n"})

    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0")
    mw = EloquentMiddleware(app, StreamConfig(keepalive=0), store=store)
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [], "query_string": b""}
    await asyncio.wait_for(mw(scope, receive, send), 10)
    assert sent[0]["status"] == 200 and b"x-eloquent-stream" not in dict(sent[0]["headers"])
    assert b"".join(m.get("body", b"") for m in sent[1:]) == b"data: a\n\ndata: b\n\n"
    sent.clear()
    await asyncio.wait_for(mw({**scope, "headers": [(b"last-event-id", b"A" * 22 + b":1")]}, receive, send), 10)
    assert sent[0]["status"] == 503 and json.loads(sent[1]["body"])["error"]["code"] == "resume_store_unavailable"
    await store.aclose()


async def test_added_without_arguments_like_vllm_does(monkeypatch):
    """``app.add_middleware(EloquentMiddleware)`` passes no config: it comes from ELOQUENT_* variables."""
    import httpx
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    monkeypatch.setenv("ELOQUENT_RESUME", "0")
    monkeypatch.setenv("ELOQUENT_KEEPALIVE", "7")

    async def endpoint(request: Any) -> StreamingResponse:
        async def body():
            yield b"data: 1\n\n"
        return StreamingResponse(body(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/s", endpoint)], middleware=[Middleware(EloquentMiddleware)])
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        response = await client.get("/s")
    assert response.content == b"data: 1\n\n" and response.headers["x-accel-buffering"] == "no"
    middleware = app.middleware_stack
    while not isinstance(middleware, EloquentMiddleware):
        middleware = middleware.app
    assert middleware.config.keepalive == 7 and middleware.store is None


def test_retry_with_non_ascii_digits_is_ignored():
    """WHATWG: ``retry`` takes ASCII digits only, else the field is ignored; ``str.isdigit()`` also took "²",
    ``int()`` then raised and the stream ended in an in-band error."""
    parser = SSEParser()
    messages = parser.feed("retry: ²\ndata: a\n\nretry: ٣\ndata: b\n\nretry: 7\ndata: c\n\n".encode())
    assert [(m.data, m.retry) for m in messages] == [("a", None), ("b", None), ("c", 7)]
    assert parser.retry == 7


async def test_receive_relay_cancelling_one_waiter_does_not_cancel_the_other() -> None:
    """The app's read and the pump wait on one change future; closing the pump (or a task group cancelling the
    app's disconnect listener) must leave the other waiter running (it once ended every vLLM stream at once)."""
    import asyncio

    from eloquent_plugins.transports.sse.receive import ReceiveRelay

    arrived = asyncio.Event()
    messages: asyncio.Queue[dict] = asyncio.Queue()

    async def server_receive() -> dict:
        arrived.set()
        return await messages.get()

    relay = ReceiveRelay(server_receive)
    app_read = asyncio.ensure_future(relay.receive())
    await arrived.wait()
    relay.watch()  # the pump now waits on the same change future as the app's read
    await asyncio.sleep(0.01)
    relay.close()  # cancels the pump (and the app's in-flight read task)
    await asyncio.sleep(0.01)
    assert not app_read.done() or not app_read.cancelled()
    app_read.cancel()
    waiter = asyncio.ensure_future(relay._wait())
    other = asyncio.ensure_future(relay._wait())
    await asyncio.sleep(0)
    waiter.cancel()
    await asyncio.sleep(0)
    relay._notify()
    await asyncio.wait_for(other, 1)
    assert not other.cancelled()
