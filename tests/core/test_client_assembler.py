"""The client's Eloquent assembler against the server's response stream, both sans-I/O: in-order exactly-once
rendering from datagrams, the trailer and the fallback; digest and completeness checks."""

from __future__ import annotations

import random

import pytest

from eloquent_plugins.core.assembler import EloquentAssembler
from eloquent_plugins.core.errors import IncompleteStream, LimitExceeded, ProtocolViolation
from eloquent_plugins.core.events import EventKind
from eloquent_plugins.core.response_stream import EloquentResponseStream
from eloquent_plugins.core.sender import SenderConfig
from eloquent_plugins.core.sse_writer import format_event
from eloquent_plugins.core.wire import AckPacket, encode_packet

SID = 4
BODY = b"".join(format_event(f'{{"choices":[{{"delta":{{"content":"w{i} "}}}}]}}') for i in range(40))
BODY += format_event("[DONE]")


def drive(loss: float, seed: int, *, fallback_after: float = 1.0) -> tuple[list[bytes], EloquentAssembler,
                                                                            EloquentResponseStream]:
    rng = random.Random(seed)
    now = 0.0
    server = EloquentResponseStream(SID, SenderConfig(), now=now, fallback_after=fallback_after)
    client = EloquentAssembler(SID)
    rendered: list[bytes] = []
    chunks = [BODY[i:i + 37] for i in range(0, len(BODY), 37)]
    control = b""
    for step in range(2000):
        now += 0.01
        if chunks:
            server.feed_body(chunks.pop(0), now)
            if not chunks:
                control = server.finish(now)
        if control and rng.random() < 0.5:  # the reliable stream arrives at some point
            rendered += [e.payload for e in client.on_control(control)]
            control = b""
        if server.fallback_due(now):
            rendered += [e.payload for e in client.on_control(server.fallback_record())]
        for datagram in server.datagrams_to_send(now):
            if rng.random() >= loss:
                rendered += [e.payload for e in client.on_datagram(datagram, now)]
                for ack in client.acks(now):
                    if rng.random() >= loss:
                        server.receive_datagram(ack, now)
        if client.complete and (server.finished or server.fallback_sent):
            break
    return rendered, client, server


@pytest.mark.parametrize("loss,seed", [(0.0, 1), (0.2, 2), (0.5, 3), (0.9, 4), (1.0, 5)])
def test_every_event_once_in_order_whatever_the_loss(loss: float, seed: int) -> None:
    rendered, client, server = drive(loss, seed)
    expected = [f'{{"choices":[{{"delta":{{"content":"w{i} "}}}}]}}'.encode() for i in range(40)] + [b"[DONE]", b""]
    assert rendered == expected
    assert client.complete and client.final is not None and client.final.kind is EventKind.END
    if loss == 1.0:
        assert server.fallback_sent and client.fallback_events > 0


def test_a_digest_mismatch_is_detected() -> None:
    server = EloquentResponseStream(SID, SenderConfig(), now=0.0)
    server.feed_body(format_event("a") + format_event("b"), 0.0)
    trailer = server.finish(0.0)
    client = EloquentAssembler(SID)
    for datagram in server.datagrams_to_send(0.0):
        client.on_datagram(datagram, 0.0)
    forged = trailer.replace(trailer.split(b'"sha256":"')[1][:8], b"00000000")
    with pytest.raises(IncompleteStream, match="digest"):
        client.on_control(forged)


def test_a_stream_that_ends_without_trailer_or_events_is_incomplete() -> None:
    client = EloquentAssembler(SID)
    with pytest.raises(IncompleteStream, match="no trailer"):
        client.on_stream_end()
    server = EloquentResponseStream(SID, SenderConfig(), now=0.0)
    server.feed_body(format_event("a") + format_event("b"), 0.0)
    client.on_control(server.finish(0.0))  # trailer, but the data events never came
    with pytest.raises(IncompleteStream, match="missing"):
        client.on_stream_end()


def test_server_stream_rejects_lies_and_floods() -> None:
    server = EloquentResponseStream(SID, SenderConfig(), now=0.0)
    server.feed_body(format_event("a"), 0.0)
    assert server.datagrams_to_send(0.0)
    with pytest.raises(ProtocolViolation):
        server.receive_datagram(encode_packet(AckPacket(SID, 50, 0, 0.0)), 0.1)
    server = EloquentResponseStream(SID, SenderConfig(), now=0.0)
    server.feed_body(format_event("a"), 0.0)
    server.datagrams_to_send(0.0)
    with pytest.raises(LimitExceeded):
        for _ in range(100):
            server.receive_datagram(encode_packet(AckPacket(SID, 0, 0, 0.0)), 0.1)


def test_oversized_event_is_refused_before_it_is_logged() -> None:
    from eloquent_plugins.core.limits import Limits

    server = EloquentResponseStream(SID, SenderConfig(limits=Limits(max_event_bytes=100)), now=0.0)
    with pytest.raises(LimitExceeded):
        server.feed_body(format_event("x" * 500), 0.0)
    trailer = server.fail("too big", 0.0)
    assert b'"kind":"error"' in trailer and b'"count":1' in trailer


def test_a_client_that_never_acks_is_noticed() -> None:
    server = EloquentResponseStream(SID, SenderConfig(), now=0.0, ack_timeout=5.0)
    server.feed_body(format_event("a"), 0.0)
    server.datagrams_to_send(0.0)
    assert not server.stalled(4.0) and server.stalled(5.5)
    deadline = server.next_deadline()
    assert deadline is not None and deadline <= 5.0


# ---- a hostile server's fallback records (issue 28) -----------------------------------------------------------
def test_fallback_records_after_the_final_event_are_not_held() -> None:
    from eloquent_plugins.core.control import encode_fallback
    from eloquent_plugins.core.events import StreamEvent

    _, client, _ = drive(0.0, 1)
    assert client.complete
    for i in range(2000):  # what a hostile server may go on sending once the stream is complete
        client.on_control(encode_fallback([StreamEvent(i, b"x" * 64), StreamEvent(10_000 + i, b"y" * 64)]))
    assert client._pending == {} and client._pending_bytes == 0


def test_out_of_order_fallback_events_are_bounded_even_when_empty() -> None:
    from eloquent_plugins.core.assembler import HELD_OVERHEAD
    from eloquent_plugins.core.control import encode_fallback
    from eloquent_plugins.core.events import StreamEvent
    from eloquent_plugins.core.limits import Limits

    limit = 64 << 10
    client = EloquentAssembler(SID, Limits(max_buffered_bytes=limit))
    with pytest.raises(LimitExceeded, match="out of order"):
        for i in range(limit):  # empty payloads past a gap: never renderable, each one still costs
            client.on_control(encode_fallback([StreamEvent(1 + i, b"")]))
    assert len(client._pending) <= limit // HELD_OVERHEAD + 1
    # Events that arrive in order are rendered and released: the count goes back down.
    done = EloquentAssembler(SID, Limits(max_buffered_bytes=limit))
    done.on_control(encode_fallback([StreamEvent(i, b"z" * 100) for i in range(1, 200)]))
    assert done._pending_bytes == 199 * (100 + HELD_OVERHEAD)
    assert [e.index for e in done.on_control(encode_fallback([StreamEvent(0, b"a")]))] == list(range(200))
    assert done._pending == {} and done._pending_bytes == 0
