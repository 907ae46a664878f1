"""The ledger of incomplete request bodies and its pace rule (``transports/body_budget.py``, issue 28), alone and at
each place that feeds it: an HTTP/3 request (``http3/request.py``), a WebTransport head (``http3/webtransport.py``)
and an HTTP/1.1 body (``request_timeouts.BodyTimeoutMiddleware``). The same attacks at full size against ``eloquent
serve`` are ``tests/transports/test_hostile_bodies.py``."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aioquic.h3.events import HeadersReceived, WebTransportStreamDataReceived

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.protocol import H3_NO_ERROR
from eloquent_plugins.core.scheme import Scheme
from eloquent_plugins.transports.body_budget import BODY_RESERVE, CHUNK_OVERHEAD, BodyClock, HeldBodies
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.http3.request import Request
from eloquent_plugins.transports.http3.scope import http_scope
from eloquent_plugins.transports.http3.webtransport import WebTransportSessions
from eloquent_plugins.transports.request_timeouts import BodyTimeoutMiddleware
from eloquent_plugins.transports.sse.middleware import EloquentMiddleware
from eloquent_plugins.transports.stack import wrap
from tests.support.h3_hosts import RecordingRequestHost, RecordingSessionHost, head_line, server_state

KIB = 1 << 10
CHUNK = 10 * KIB
COST = CHUNK + CHUNK_OVERHEAD
"""What one 10 KiB chunk counts."""


def ledger(**ceilings: int) -> HeldBodies:
    return HeldBodies(reserve=BODY_RESERVE, **ceilings)


# -- the ledger -------------------------------------------------------------------------------------------------


def test_a_connection_ceiling_refuses_429_while_others_hold_and_413_for_one_body_alone() -> None:
    book = ledger(per_connection=BODY_RESERVE * 2 + COST * 3)
    first, second = book.open("conn", "10.0.0.1"), book.open("conn", "10.0.0.1")
    assert first.hold(CHUNK) is None and first.hold(CHUNK) is None
    assert second.hold(CHUNK) is None
    refusal = second.hold(CHUNK)  # the room is taken by the first body: waiting may help
    assert refusal is not None and (refusal.status, refusal.code, refusal.reason, refusal.retry_after) == (
        429, "rate_limit_exceeded", "connection", 1)
    second.release()
    first.release()
    lone = book.open("conn", "10.0.0.1")
    for _ in range(4):
        lone.hold(CHUNK)
    alone = lone.hold(CHUNK)
    assert alone is not None and (alone.status, alone.code) == (413, "request_too_large")
    lone.release()
    assert (book.held, book.bodies, book.held_by("conn"), book.held_from("10.0.0.1")) == (0, 0, 0, 0)
    assert book.refused["connection"] == 2


def test_an_address_ceiling_spans_connections_and_other_addresses_are_not_touched() -> None:
    book = ledger(per_address=BODY_RESERVE * 2 + COST * 2)
    a, b = book.open("conn-a", "10.0.0.1"), book.open("conn-b", "10.0.0.1")
    other = book.open("conn-c", "10.0.0.2")
    assert a.hold(CHUNK) is None and b.hold(CHUNK) is None
    refused = a.hold(CHUNK)
    assert refused is not None and refused.reason == "address" and refused.status == 429
    assert other.hold(CHUNK) is None and other.hold(CHUNK) is None  # another address has its own room
    assert book.held_from("10.0.0.1") == 2 * (BODY_RESERVE + COST)


def test_the_total_is_a_share_of_max_held_bytes_and_refuses_503() -> None:
    config = StreamConfig(max_held_bytes=8 << 20, max_body_bytes_per_connection=0, max_body_bytes_per_address=0)
    book = HeldBodies.from_config(config)
    assert book.total == 2 << 20
    bodies = [book.open(f"conn-{i}", f"10.0.0.{i}") for i in range(300)]
    refusals = [body.hold(CHUNK) for body in bodies]
    first = next(r for r in refusals if r is not None)
    assert (first.status, first.code, first.reason) == (503, "server_overloaded", "budget")
    assert book.held <= book.total


def test_a_declared_length_that_cannot_fit_is_refused_before_its_bytes_come_and_counts_nothing() -> None:
    book = ledger(per_connection=4 << 20)
    held = book.open("conn", None)
    assert held.hold(0, expected=3 << 20) is None and book.held == BODY_RESERVE  # checked, not counted
    late = book.open("conn", None)
    assert late.hold(0, expected=1 << 20) is None
    big = book.open("conn", None)
    refused = big.hold(0, expected=5 << 20)
    assert refused is not None and refused.status == 413
    assert book.held == 2 * BODY_RESERVE


def test_release_is_idempotent_and_a_released_body_counts_nothing_more() -> None:
    book = ledger()
    body = book.open("conn", "10.0.0.1")
    body.hold(CHUNK)
    body.release()
    body.release()
    assert body.hold(CHUNK) is None and book.held == 0 and book.bodies == 0


def test_a_ceiling_no_whole_body_fits_under_is_raised_to_fit_one(caplog: pytest.LogCaptureFixture) -> None:
    """Raising ``max_request_bytes`` alone (long prompts, images) must not turn every large request into a 429."""
    floor = 2 * (16 << 20) + BODY_RESERVE
    config = StreamConfig(max_request_bytes=16 << 20)  # the default ceilings (8 and 32 MiB) are below two bodies
    book = HeldBodies.from_config(config)
    assert (book.per_connection, book.per_address) == (floor, floor)
    assert "raised to" in caplog.text
    low = HeldBodies.from_config(StreamConfig(max_body_bytes_per_connection=1 << 20, max_body_bytes_per_address=0))
    assert low.per_connection == 2 * (1 << 20) + BODY_RESERVE and low.per_address == 0, "0 stays off"


def test_settings_refuse_what_cannot_work() -> None:
    with pytest.raises(ConfigError, match="body_min_rate"):
        StreamConfig(body_timeout=0, body_rate_grace=0)
    with pytest.raises(ConfigError):
        StreamConfig(body_min_rate=-1)
    assert StreamConfig.from_env({"ELOQUENT_BODY_MIN_RATE": "0", "ELOQUENT_MAX_BODY_BYTES_PER_ADDRESS": "0"}) == \
        StreamConfig(body_min_rate=0, max_body_bytes_per_address=0)


# -- the pace ---------------------------------------------------------------------------------------------------


def test_a_byte_every_29_s_after_a_burst_ends_body_timeout_after_the_burst_as_too_slow() -> None:
    clock = BodyClock(timeout=30.0, min_rate=1024, grace=10.0, now=0.0)
    clock.arrived(1 << 20, 0.5)  # the body, one byte short, at once
    assert clock.deadline() == 30.5
    clock.arrived(1, 29.0)  # before: this kept the body alive for another 30 s, and so on forever
    deadline = clock.deadline()
    assert deadline is not None and 30.5 <= deadline < 30.51
    refusal = clock.refusal(deadline)
    assert (refusal.status, refusal.reason) == (408, "too_slow")


def test_a_steady_body_at_the_pace_is_never_due_and_silence_is_a_stall() -> None:
    clock = BodyClock(timeout=30.0, min_rate=1000, grace=5.0, now=0.0)
    for second in range(1, 120):
        clock.arrived(1000, float(second))
        deadline = clock.deadline()
        assert deadline is not None and deadline > second + 4.9
    assert clock.refusal(119.0 + 30.0).reason == "stalled"
    trickle = BodyClock(timeout=30.0, min_rate=1000, grace=5.0, now=0.0)
    trickle.arrived(10, 1.0)  # a trickle from the start: due when the grace and its few bytes are spent
    deadline = trickle.deadline()
    assert deadline is not None and 5.0 < deadline < 5.1


def test_without_a_rate_the_clock_is_the_old_stall_deadline() -> None:
    clock = BodyClock(timeout=2.0, min_rate=0, grace=10.0, now=0.0)
    clock.arrived(1, 5.0)
    assert clock.deadline() == 7.0 and clock.refusal(7.0).reason == "stalled"
    assert BodyClock(timeout=0, min_rate=0, grace=0, now=0.0).deadline() is None


# -- where the bytes arrive -------------------------------------------------------------------------------------


async def never_answers(scope: Any, receive: Any, send: Any) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def h3_request(host: RecordingRequestHost, stream_id: int, declared: int = 0) -> Request:
    scope = http_scope(b"POST", b"/v1/chat/completions", [], client=("127.0.0.1", 1), server=("127.0.0.1", 2))
    request = Request(host, stream_id, scope, Scheme.STREAM, host.state.codecs.for_path(scope["path"]))
    request.body.hold(host.state.held.open(host, "127.0.0.1"), declared)
    return request


async def test_an_http3_body_over_the_connection_ceiling_gets_429_json_and_stop_sending_and_frees_its_bytes() -> None:
    config = StreamConfig(max_request_bytes=80 * KIB, max_body_bytes_per_connection=176 * KIB)
    host = RecordingRequestHost(server_state(never_answers, config))
    book = host.state.held
    first, second, third = h3_request(host, 0), h3_request(host, 4), h3_request(host, 8)
    for _ in range(6):
        first.on_body(b"x" * CHUNK, False)
        second.on_body(b"y" * CHUNK, False)
    assert book.held_by(host) == 3 * BODY_RESERVE + 12 * COST
    third.on_body(b"z" * CHUNK, False)  # two bodies hold the room: this one may not grow
    assert host.wire.status(8) == 429
    fields = dict(next(e[2] for e in host.wire.of("headers") if e[1] == 8))
    assert fields[b"retry-after"] == b"1"
    error = json.loads(host.wire.body(8))["error"]
    assert error["code"] == "rate_limit_exceeded" and "on one connection" in error["message"]
    assert ("stop", 8, H3_NO_ERROR) in host.wire.sent  # the answer is complete without the rest of the body
    assert book.held_by(host) == 2 * (BODY_RESERVE + 6 * COST)  # the refused body is out of the ledger
    first.on_body(b"", True)  # the first body is in: it holds nothing any more
    second.disconnect()  # the second's client left
    assert book.held == 0 and book.refused["connection"] == 1


async def test_while_the_ledger_is_full_a_body_whole_with_its_head_is_served_and_one_that_cannot_fit_is_refused_at_once(
        ) -> None:
    config = StreamConfig(max_request_bytes=80 * KIB, max_body_bytes_per_connection=176 * KIB)
    host = RecordingRequestHost(server_state(never_answers, config))
    hogs = [h3_request(host, 0), h3_request(host, 4)]
    for _ in range(7):
        for hog in hogs:
            hog.on_body(b"x" * CHUNK, False)  # ~173 KiB of the connection's 176
    whole = h3_request(host, 8, declared=500)
    whole.on_body(b"y" * 500, True)  # its head counted a reserve; its body came whole: never refused
    assert whole.body.done and not host.wire.of("headers") and host.state.held.held_by(host) < 176 * KIB
    big = h3_request(host, 12, declared=60 * KIB)
    big.on_body(b"z" * 1000, False)  # the rest of its declared 60 KiB cannot fit: refused at its first chunk
    assert host.wire.status(12) == 429 and big.body.done


async def test_an_http3_body_trickling_under_the_pace_gets_408_too_slow() -> None:
    config = StreamConfig(body_timeout=0.6, body_min_rate=1024, body_rate_grace=0.2)
    host = RecordingRequestHost(server_state(never_answers, config))
    request = h3_request(host, 0)
    request.on_body(b"x" * 4096, False)
    request.arm_body_timer()
    for _ in range(20):  # a byte every 0.1 s: the old rule (a stall of 0.6 s) would never end it
        if request.body.done:
            break
        await asyncio.sleep(0.1)
        request.on_body(b"x", False)
    for _ in range(100):
        if request.body.done:
            break
        await asyncio.sleep(0.05)
    assert host.wire.status(0) == 408
    assert host.state.held.refused["too_slow"] == 1 and host.state.held.held == 0


async def test_a_webtransport_head_is_held_refused_over_the_ceiling_and_released_when_it_completes() -> None:
    config = StreamConfig(max_request_bytes=16 * KIB, max_body_bytes_per_connection=100 * KIB)
    host = RecordingSessionHost(server_state(None, config))
    wt = WebTransportSessions(host, "/eloquent/wt")
    wt.open_session(HeadersReceived(headers=[(b":method", b"CONNECT"), (b":protocol", b"webtransport"),
                                             (b":path", b"/eloquent/wt"), (b":authority", b"x")],
                                    stream_id=0, stream_ended=False))

    def data(stream_id: int, payload: bytes) -> WebTransportStreamDataReceived:
        return WebTransportStreamDataReceived(data=payload, stream_id=stream_id, stream_ended=False, session_id=0)

    book = host.state.held
    wt.stream_data(data(4, b'{"method": "POST", ' + b" " * (40 * KIB)))
    assert book.held_by(host) > 40 * KIB
    wt.stream_data(data(8, b" " * (40 * KIB)))
    wt.stream_data(data(8, b" " * (40 * KIB)))  # the connection holds 100 KiB: this head may not grow
    assert host.refusals[-1][0] == 8 and host.refusals[-1][1].status == 429
    assert ("stop", 8, H3_NO_ERROR) in host.wire.sent
    wt.stream_data(data(4, b'"path": "/v1/chat/completions"}\n{}'))  # head 4 completes: it holds nothing now
    assert 4 in host.opened and book.held == 0 and not wt.pending


async def test_an_http1_body_over_the_address_ceiling_gets_429_and_the_app_sees_the_client_gone() -> None:
    book = HeldBodies(per_address=60 * KIB)
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        while True:
            message = await receive()
            seen.append(message["type"])
            if message["type"] == "http.disconnect":
                return

    chunks = [{"type": "http.request", "body": b"x" * CHUNK, "more_body": True} for _ in range(5)]

    async def receive() -> dict[str, Any]:
        if chunks:
            return chunks.pop(0)
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    other = book.open("other", "10.0.0.9")
    assert other.hold(CHUNK) is None  # a body on another connection from the same address
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
             "client": ("10.0.0.9", 5)}
    await asyncio.wait_for(BodyTimeoutMiddleware(app, 5.0, bodies=book)(scope, receive, send), 5)
    assert seen[-1] == "http.disconnect" and seen.count("http.request") == 1
    assert sent[0]["status"] == 429
    headers = dict(sent[0]["headers"])
    assert headers[b"connection"] == b"close" and headers[b"retry-after"] == b"1"
    assert json.loads(sent[1]["body"])["error"]["code"] == "rate_limit_exceeded"
    assert book.held_from("10.0.0.9") == other.held and book.refused["address"] == 1


def test_the_stack_shares_the_stream_layers_ledger_which_counts_in_its_memory_budget() -> None:
    stack = wrap(never_answers, StreamConfig(resume=False))
    assert isinstance(stack.streams, EloquentMiddleware) and stack.bodies is stack.streams.bodies
    body = stack.bodies.open("conn", "10.0.0.1")
    body.hold(CHUNK)
    assert stack.streams.budget.held() == BODY_RESERVE + COST
    text = stack.streams.metrics.render()[0].decode()
    assert f"eloquent_request_bytes_held {float(BODY_RESERVE + COST)}" in text
    assert 'eloquent_request_bodies_refused_total{reason="too_slow"} 0.0' in text
    body.release()
