"""``Exchange`` and the resume endpoint driven against a small host of their own, not ``EloquentMiddleware``.

Why: each names what it needs of its host (``transports.sse.host``); this host is those members and nothing
more, built from the real parts (memory store, budget, limits, drain, codecs), so the pieces are shown to work
without their owner, and a member they start to use that the Protocols do not name fails here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pluggy

from eloquent_plugins.core.codecs.base import Codec
from eloquent_plugins.core.codecs.router import CodecRouter
from eloquent_plugins.core.hooks.manager import codecs, create_plugin_manager
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.padding import PaddingPolicy
from eloquent_plugins.core.protocol import parse_event_id
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.transports.asgi import ASGIApp, Message, Receive, Send
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.drain import Drain
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.transports.resume import create_store
from eloquent_plugins.transports.resume.base import ResumeStore
from eloquent_plugins.transports.sse.budget import StreamBudget
from eloquent_plugins.transports.sse.exchange import Exchange
from eloquent_plugins.transports.sse.host import LocalStream, Merge, ResumeHost, StreamHost
from eloquent_plugins.transports.sse.ids import IdentityFunction
from eloquent_plugins.transports.sse.limits import ClientLimits
from eloquent_plugins.transports.sse.resume import serve_resume

PAYLOADS = [b'{"n":%d}' % i for i in range(5)]


def events_app(payloads: list[bytes], gate: asyncio.Event | None = None) -> ASGIApp:
    """A streaming app: one ``data:`` event per payload; with ``gate``, it waits for it after the first."""

    async def app(scope: Any, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        for i, payload in enumerate(payloads):
            if i == 1 and gate is not None:
                await asyncio.wait_for(gate.wait(), 10)
            await asyncio.sleep(0)
            await send({"type": "http.response.body", "body": b"data: %s\n\n" % payload, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


@dataclass(eq=False)
class SmallHost:
    """Exactly the members of ``StreamHost`` and ``ResumeHost``, from real parts (no middleware)."""

    app: ASGIApp
    config: StreamConfig = field(default_factory=lambda: StreamConfig(keepalive=0))
    pm: pluggy.PluginManager = field(default_factory=create_plugin_manager)
    metrics: StreamMetrics = field(default_factory=lambda: StreamMetrics(None))
    identity: IdentityFunction | None = None
    policy: KeepAlivePolicy = field(default_factory=lambda: KeepAlivePolicy(0))
    padding: PaddingPolicy | None = None
    lease_ttl: float = 1.0
    drain: Drain = field(default_factory=Drain)
    exchanges: dict[str, LocalStream] = field(default_factory=dict)
    spans: dict[str, Any] = field(default_factory=dict)
    tracer: Any = None

    def __post_init__(self) -> None:
        self.codecs: dict[str, Codec] = codecs(self.pm)
        self.router = CodecRouter(self.codecs, None)
        self.store: ResumeStore | None = create_store(self.config)
        self.budget = StreamBudget(self.config.max_held_bytes, self.store, self.metrics, retry_after=1.0)
        self.limits = ClientLimits(self.config.max_streams_per_client, self.identity)

    def codec_for(self, path: str) -> Codec:
        return self.router.for_path(path)

    def merge_for(self, codec: Codec) -> Merge | None:
        return None


def scope(*, last_event_id: str | None = None, key: bytes = b"Bearer a") -> dict[str, Any]:
    headers = [(b"authorization", key), (b"content-type", b"application/json")]
    if last_event_id is not None:
        headers.append((b"last-event-id", last_event_id.encode()))
    return {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers,
            "query_string": b"", "http_version": "1.1"}


class Client:
    """What a client is sent; ``receive`` hands it the request, then waits (it never leaves on its own)."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def send(self, message: Message) -> None:
        self.messages.append(message)

    async def receive(self) -> Message:
        if not hasattr(self, "_asked"):
            self._asked = True
            return {"type": "http.request", "body": b"{}", "more_body": False}
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    def events(self) -> list[tuple[str | None, bytes]]:
        parser = SSEParser()
        body = b"".join(m.get("body", b"") for m in self.messages if m["type"] == "http.response.body")
        return [(message.id, message.data.encode()) for message in parser.feed(body)]

    @property
    def complete(self) -> bool:
        last = self.messages[-1]
        return last["type"] == "http.response.body" and not last.get("more_body", False)


async def first_event(client: Client) -> None:
    """Until ``client`` has an event (at most 2 s: a guard, not a measurement)."""
    for _ in range(200):
        if client.events():
            return
        await asyncio.sleep(0.01)


async def stream(host: StreamHost) -> Client:
    client = Client()
    await asyncio.wait_for(Exchange(host, scope(), client.receive, client.send).run(), 10)
    return client


async def resume(host: ResumeHost, event_id: str, *, key: bytes = b"Bearer a") -> Client:
    client = Client()
    await asyncio.wait_for(serve_resume(host, scope(last_event_id=event_id, key=key), client.receive, client.send,
                                        event_id), 10)
    return client


async def test_an_exchange_on_a_small_host_streams_with_ids_and_leaves_nothing_behind() -> None:
    host = SmallHost(events_app(PAYLOADS))
    client = await stream(host)
    assert client.status == 200 and client.complete
    events = client.events()
    assert [data for _, data in events] == PAYLOADS
    points = [parse_event_id(event_id or "") for event_id, _ in events]
    assert [p.after for p in points] == list(range(len(PAYLOADS)))
    assert len({p.token for p in points}) == 1
    assert host.exchanges == {} and host.spans == {}
    assert host.metrics.events == len(PAYLOADS) and host.metrics.active_streams == 0


async def test_a_resume_on_a_small_host_gets_the_events_after_its_id() -> None:
    host = SmallHost(events_app(PAYLOADS))
    first = await stream(host)
    event_id = first.events()[1][0]
    assert event_id is not None
    again = await resume(host, event_id)
    assert again.status == 200 and again.complete
    assert again.events() == first.events()[2:]


async def test_a_resume_of_a_live_stream_is_seen_by_its_exchange() -> None:
    gate = asyncio.Event()
    host = SmallHost(events_app(PAYLOADS, gate))
    first = Client()
    producing = asyncio.ensure_future(Exchange(host, scope(), first.receive, first.send).run())
    await first_event(first)
    event_id = first.events()[0][0]
    assert event_id is not None
    (token, exchange), = host.exchanges.items()
    assert token == parse_event_id(event_id).token
    resuming = asyncio.ensure_future(resume(host, event_id))
    for _ in range(200):
        if getattr(exchange, "local_readers", 0) == 1:
            break
        await asyncio.sleep(0.01)
    assert getattr(exchange, "local_readers") == 1  # the resume told the producer it reads the stream here
    gate.set()
    await asyncio.wait_for(producing, 10)
    again = await asyncio.wait_for(resuming, 10)
    assert again.events() == first.events()[1:] and again.complete
    assert getattr(exchange, "local_readers") == 0


async def test_a_resume_on_a_small_host_is_refused_to_another_caller_and_for_an_unknown_stream() -> None:
    host = SmallHost(events_app(PAYLOADS))
    first = await stream(host)
    event_id = first.events()[0][0]
    assert event_id is not None
    other = await resume(host, event_id, key=b"Bearer b")
    assert other.status == 403 and other.events() == []
    token = parse_event_id(event_id).token
    unknown = await resume(host, event_id.replace(token, "x" * len(token)))
    assert unknown.status == 404


async def test_nothing_is_logged_after_the_hand_over() -> None:
    """The drain's deadline hands a running stream over: the store copies what its log holds, another replica
    continues from there. An event logged after that (the app does not stop at once) would reach a resume on this
    replica and never the store: the client would hold an event the continuing replica cannot know (found by
    ``eloquent bench load --restart-every``: "sent but never copied", the stream lost). The event path's direct
    way in must be closed too, not only the exchange's own."""
    gate = asyncio.Event()
    payloads = [b'{"n":%d}' % i for i in range(40)]
    host = SmallHost(events_app(payloads, gate))
    first = Client()
    producing = asyncio.ensure_future(Exchange(host, scope(), first.receive, first.send).run())
    await first_event(first)
    (_, exchange), = host.exchanges.items()
    stream_log = exchange.log  # type: ignore[attr-defined]
    await exchange.hand_over()  # type: ignore[attr-defined]
    logged = stream_log.next_index
    gate.set()  # the app sends its 39 other events as if nothing happened
    await asyncio.wait_for(producing, 10)
    assert stream_log.next_index == logged == 1, "events were logged after the hand-over"
