"""The client's per-request HTTP/3 stream without a network: its lifecycle (``Phase``) and its errors, fed the
way the QUIC protocol feeds it (headers, control records, datagrams, resets)."""

from __future__ import annotations

import pytest
from eloquent_client import BodyKind, ClientError, H3Stream, IncompleteStream, Phase

from eloquent_plugins.core.errors import IncompleteStream as CoreIncompleteStream
from eloquent_plugins.core.errors import ProtocolError
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.response_stream import EloquentResponseStream
from eloquent_plugins.core.sender import SenderConfig
from eloquent_plugins.core.sse_writer import format_event

SID = 0
HEAD = [(b":status", b"200"), (b"eloquent-transport", b"datagram"), (b"content-type", b"text/event-stream")]


class FakeProtocol:
    """What an ``H3Stream`` calls back into: acks out, protocol failures, forgetting the stream."""

    def __init__(self) -> None:
        self.acks: list[bytes] = []
        self.failed: list[ProtocolError] = []
        self.forgotten: list[bool] = []

    def send_datagram(self, stream_id: int, data: bytes) -> None:
        self.acks.append(data)

    def fail(self, error: ProtocolError) -> None:
        self.failed.append(error)

    def forget(self, stream_id: int, *, cancel: bool) -> None:
        self.forgotten.append(cancel)


def served(*texts: str) -> tuple[list[bytes], bytes]:
    server = EloquentResponseStream(SID, SenderConfig(), now=0.0)
    server.feed_body(b"".join(format_event(t) for t in texts), 0.0)
    trailer = server.finish(0.0)
    return server.datagrams_to_send(0.0), trailer


async def drain(stream: H3Stream) -> list[str]:
    return [event.data async for event in stream.events()]


async def test_an_eloquent_stream_completes_then_ends_and_is_kept_for_late_datagrams() -> None:
    protocol = FakeProtocol()
    stream = H3Stream(protocol, SID, eloquent=True, limits=Limits())  # type: ignore[arg-type]
    assert stream.phase is Phase.AWAITING_HEADERS and stream.body_kind is None
    datagrams, trailer = served("a", "b")
    stream.on_datagram(datagrams[0], 0.0)  # overtakes the headers: kept until they come
    stream.on_headers(HEAD, False)
    assert stream.phase is Phase.RECEIVING and stream.body_kind is BodyKind.ELOQUENT and stream.eloquent
    for datagram in datagrams[1:]:
        stream.on_datagram(datagram, 0.0)
    stream.on_data(trailer, False)
    assert stream.phase is Phase.COMPLETE and not stream.done and protocol.acks
    assert await drain(stream) == ["a", "b"]
    stream.cancel()
    assert protocol.forgotten == [False], "a complete stream is not cancelled"
    stream.on_reset(0x10C)  # the server giving up on the request stream after completion is no error
    assert stream.phase is Phase.ENDED and stream.done


async def test_a_digest_mismatch_completed_by_a_datagram_fails_the_stream() -> None:
    stream = H3Stream(FakeProtocol(), SID, eloquent=True, limits=Limits())  # type: ignore[arg-type]
    datagrams, trailer = served("a", "b")
    stream.on_headers(HEAD, False)
    stream.on_data(trailer.replace(trailer.split(b'"sha256":"')[1][:8], b"00000000"), False)  # trailer first
    for datagram in datagrams:
        stream.on_datagram(datagram, 0.0)  # the last one completes the stream: the digest is checked there
    assert stream.phase is Phase.FAILED and stream.done
    with pytest.raises(IncompleteStream, match="digest") as failed:
        await drain(stream)
    assert isinstance(failed.value, ClientError) and isinstance(failed.value, CoreIncompleteStream)
    assert isinstance(failed.value.__cause__, CoreIncompleteStream)


async def test_a_stream_ending_without_its_events_is_incomplete() -> None:
    stream = H3Stream(FakeProtocol(), SID, eloquent=True, limits=Limits())  # type: ignore[arg-type]
    _, trailer = served("a", "b")
    stream.on_headers(HEAD, False)
    stream.on_data(trailer, True)  # every datagram lost and no fallback
    assert stream.phase is Phase.FAILED
    with pytest.raises(IncompleteStream, match="missing"):
        await drain(stream)


async def test_a_reset_before_completion_fails_and_cancel_resets() -> None:
    protocol = FakeProtocol()
    stream = H3Stream(protocol, SID, eloquent=False, limits=Limits())  # type: ignore[arg-type]
    stream.on_headers([(b":status", b"200"), (b"content-type", b"text/event-stream")], False)
    assert stream.body_kind is BodyKind.SSE and not stream.eloquent
    stream.on_data(b"data: x\n\n", False)
    stream.cancel()
    assert protocol.forgotten == [True]
    stream.on_reset(0x10C)
    assert stream.phase is Phase.FAILED
    events = stream.events()
    assert (await anext(events)).data == "x"
    with pytest.raises(ClientError, match="reset"):
        await anext(events)
    stream.on_data(b"data: y\n\n", True)  # nothing is taken after a failure
    assert stream.phase is Phase.FAILED


async def test_a_plain_body_is_read_whole() -> None:
    stream = H3Stream(FakeProtocol(), SID, eloquent=True, limits=Limits())  # type: ignore[arg-type]
    stream.on_headers([(b":status", b"404"), (b"content-type", b"application/json")], False)
    assert stream.body_kind is BodyKind.RAW
    stream.on_data(b'{"error":', False)
    stream.on_data(b"1}", True)
    assert stream.phase is Phase.ENDED and stream.status == 404
    assert await stream.read() == b'{"error":1}'
