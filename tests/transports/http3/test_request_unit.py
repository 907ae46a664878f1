"""One HTTP/3 request (``transports.http3.request.Request``) built against a small real ``RequestHost``, no QUIC
connection: the ASGI bridge, refusals, the in-band error of a failed SSE app, the move to Eloquent datagrams."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from eloquent_plugins.core.protocol import DATAGRAM, REQUEST_ID_HEADER, TRANSPORT_HEADER
from eloquent_plugins.core.scheme import Scheme
from eloquent_plugins.transports.http3.guards import Rejection
from eloquent_plugins.transports.http3.lifecycle import RequestState
from eloquent_plugins.transports.http3.request import Request
from eloquent_plugins.transports.http3.scope import http_scope
from tests.support.h3_hosts import RecordingRequestHost, server_state


def make(app: Any, *, scheme: Scheme = Scheme.STREAM, datagrams: bool = False,
         path: bytes = b"/v1/chat/completions", rtt: float | None = None) -> tuple[RecordingRequestHost, Request]:
    host = RecordingRequestHost(server_state(app), datagrams=datagrams, rtt=rtt)
    scope = http_scope(b"POST", path, [(b"host", b"x")], client=("127.0.0.1", 1), server=("127.0.0.1", 2))
    request = Request(host, 0, scope, scheme, host.state.codecs.for_path(scope["path"]))
    return host, request


async def echo(scope: Any, receive: Any, send: Any) -> None:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain"),
                                                                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body.upper()})


async def test_a_request_answers_through_its_host_and_ends_disconnected() -> None:
    host, request = make(echo)
    request.on_body(b"hello ", False)
    request.on_body(b"world", True)
    await request.run()
    assert host.wire.status(0) == 200
    fields = dict(host.wire.of("headers")[0][2])
    assert fields[REQUEST_ID_HEADER] == request.request_id.encode()
    assert b"connection" not in fields  # connection-specific fields never go on HTTP/3
    assert host.wire.body(0) == b"HELLO WORLD" and host.wire.of("data")[-1][3] is True
    assert request.state is RequestState.DISCONNECTED and host.done == [request]
    assert await request.receive() == {"type": "http.disconnect"}


async def test_a_refusal_is_the_routes_json_error_and_the_host_forgets_the_request() -> None:
    host, request = make(echo)
    request.reject(Rejection(413, "request body exceeds 1 bytes", "request_too_large"))
    assert host.wire.status(0) == 413
    error = json.loads(host.wire.body(0))["error"]
    assert error["code"] == "request_too_large" and "exceeds" in error["message"]
    assert request.state is RequestState.DISCONNECTED and host.forgotten == [request]


async def test_a_body_over_the_limit_is_refused_before_the_app() -> None:
    host, request = make(echo)
    request.on_body(b"x" * (host.state.config.max_request_bytes + 1), False)
    assert host.wire.status(0) == 413 and request.gone


async def test_an_sse_app_that_fails_after_its_head_gets_an_in_band_error_event() -> None:
    async def failing(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
        raise RuntimeError("engine died")

    host, request = make(failing)
    request.on_body(b"", True)
    await request.run()
    body = host.wire.body(0)
    assert body.startswith(b"data: one\n\n") and b"internal server error" in body
    assert host.wire.of("data")[-1][3] is True and request.state is RequestState.FINISHED


async def test_an_sse_response_to_a_datagram_peer_goes_eloquent_through_the_hosts_pump() -> None:
    async def sse(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: a\n\ndata: b\n\n", "more_body": False})

    host, request = make(sse, scheme=Scheme.ELOQUENT, datagrams=True)
    request.on_body(b"", True)
    await request.run()
    fields = dict(host.wire.of("headers")[0][2])
    assert fields[TRANSPORT_HEADER] == DATAGRAM and fields[b"content-type"] == b"application/x-ndjson"
    assert host.tracked == [request] and request.eloquent is not None and host.pumped == [0]
    assert host.wire.of("data"), "the trailer goes on the request stream"
    assert request.gone and host.done == [request]


async def test_an_eloquent_sender_starts_from_the_connections_measured_rtt() -> None:
    """Its first probe then comes a PTO of this path after an unanswered packet (60 ms path: 0.185 s), not one
    of the 250 ms default (0.755 s), as the simulator's sender does (docs/results/real-links.md, point 10)."""

    async def sse(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b"data: a\n\n", "more_body": False})

    timeouts = {}
    for rtt in (0.06, None):
        host, request = make(sse, scheme=Scheme.ELOQUENT, datagrams=True, rtt=rtt)
        request.on_body(b"", True)
        await request.run()
        assert request.eloquent is not None
        sender = request.eloquent.sender
        timeouts[rtt] = sender._recovery.rtt.probe_timeout(sender.config.max_ack_delay)
    assert abs(timeouts[0.06] - 0.185) < 1e-9 and abs(timeouts[None] - 0.755) < 1e-9


async def test_a_second_response_start_is_an_app_error() -> None:
    async def twice(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.start", "status": 200, "headers": []})

    host, request = make(twice)
    request.on_body(b"", True)
    await asyncio.wait_for(request.run(), 5)
    assert ("reset", 0) in [entry[:2] for entry in host.wire.sent]  # a plain response the app broke: reset
