"""WebTransport sessions (``transports.http3.webtransport.WebTransportSessions``) against a small real
``SessionHost``, no QUIC connection: the session's admission, a request stream's head, the CONNECT's Origin, and a
session's end taking its requests with it."""

from __future__ import annotations

import json

from aioquic.h3.events import HeadersReceived, WebTransportStreamDataReceived

from eloquent_plugins.core.protocol import H3_REQUEST_CANCELLED
from eloquent_plugins.transports.cors import OriginPolicy, parse_origins
from eloquent_plugins.transports.http3.webtransport import WebTransportSessions
from tests.support.h3_hosts import RecordingSessionHost, head_line, server_state

SESSION = 0


def connect(path: bytes = b"/eloquent/wt", origin: bytes | None = None, stream_id: int = SESSION) -> HeadersReceived:
    headers = [(b":method", b"CONNECT"), (b":protocol", b"webtransport"), (b":scheme", b"https"),
               (b":authority", b"127.0.0.1:4433"), (b":path", path)]
    if origin is not None:
        headers.append((b"origin", origin))
    return HeadersReceived(headers=headers, stream_id=stream_id, stream_ended=False)


def sessions(policy: OriginPolicy | None = None) -> tuple[RecordingSessionHost, WebTransportSessions]:
    host = RecordingSessionHost(server_state())
    return host, WebTransportSessions(host, "/eloquent/wt", policy)


def data(stream_id: int, payload: bytes, ended: bool = False) -> WebTransportStreamDataReceived:
    return WebTransportStreamDataReceived(data=payload, stream_id=stream_id, stream_ended=ended, session_id=SESSION)


async def test_a_session_is_admitted_by_path_and_origin() -> None:
    host, wt = sessions(OriginPolicy(parse_origins(("https://good.example",))))
    wt.open_session(connect(b"/elsewhere", stream_id=0))
    wt.open_session(connect(origin=b"https://evil.example", stream_id=4))
    wt.open_session(connect(origin=b"https://good.example", stream_id=8))
    assert [host.wire.status(s) for s in (0, 4, 8)] == [404, 403, 200]
    assert [e[3] for e in host.wire.of("headers")] == [True, True, False]  # a refused CONNECT is ended
    assert not wt.is_session(0) and not wt.is_session(4) and wt.is_session(8)


async def test_a_stream_head_in_two_pieces_opens_a_request_with_the_connects_origin_and_host() -> None:
    host, wt = sessions()
    wt.open_session(connect(origin=b"https://127.0.0.1:4433"))
    line = head_line(origin="https://evil.example", authorization="Bearer t")
    wt.stream_data(data(4, line[:10]))
    assert not host.opened  # the head is not complete yet
    wt.stream_data(data(4, line[10:] + b'{"x":1}', ended=True))
    request = host.opened[4]
    method, path, headers, ended, transport = request.head
    assert (method, path, transport) == (b"POST", b"/v1/chat/completions", "webtransport")
    assert (b"origin", b"https://127.0.0.1:4433") in headers and (b"origin", b"https://evil.example") not in headers
    assert headers[0] == (b"host", b"127.0.0.1:4433") and (b"authorization", b"Bearer t") in headers
    assert request.body == [(b'{"x":1}', True)]
    assert wt.carries(4) and wt.datagram_target(4) == SESSION


async def test_a_bad_head_is_refused_with_400_and_later_bytes_are_dropped() -> None:
    host, wt = sessions()
    wt.open_session(connect())
    wt.stream_data(data(4, b"not json\n"))
    assert [(s, r.status) for s, r in host.refusals] == [(4, 400)]
    wt.stream_data(data(4, head_line()))
    assert not host.opened


async def test_a_stream_whose_first_bytes_come_after_a_later_streams_is_served() -> None:
    """Under loss, stream 8's first packet can arrive before stream 4's: 4 is a new request, not a late one (it was
    dropped for good when every id below the highest seen counted as ended)."""
    host, wt = sessions()
    wt.open_session(connect())
    wt.stream_data(data(8, head_line()))
    wt.stream_data(data(4, head_line()))
    assert sorted(host.opened) == [4, 8]


async def test_an_ended_stream_drops_late_bytes_until_aioquic_forgets_it() -> None:
    host, wt = sessions()
    wt.open_session(connect())
    wt.stream_data(data(4, head_line()))
    wt.forget(4)  # its request is over on both sides
    wt.stream_data(data(4, b"late bytes"))
    assert list(host.opened) == [4] and not host.refusals and not wt.pending
    host.discarded.add(4)  # aioquic discarded it: no frame for it reaches us any more, nor need it be remembered
    for stream_id in range(8, 8 + 4 * 70, 4):
        wt.stream_data(data(stream_id, head_line()))
        wt.forget(stream_id)
    assert 4 not in wt.closed and len(wt.closed) <= 70


async def test_a_unidirectional_stream_or_an_unknown_session_is_stopped() -> None:
    host, wt = sessions()
    wt.open_session(connect())
    wt.stream_data(data(2, head_line()))
    assert ("stop", 2, H3_REQUEST_CANCELLED) in host.wire.sent and not host.opened


async def test_a_session_that_ends_takes_its_requests_with_it() -> None:
    host, wt = sessions()
    wt.open_session(connect())
    wt.stream_data(data(4, head_line()))
    wt.stream_data(data(8, head_line()))
    assert wt.session_data(SESSION, ended=True)
    assert host.opened[4].disconnected and host.opened[8].disconnected
    assert host.dropped == [4, 8]
    assert [e for e in host.wire.sent if e[0] == "reset"] == [("reset", 4, H3_REQUEST_CANCELLED),
                                                              ("reset", 8, H3_REQUEST_CANCELLED)]
    assert ("raw", SESSION, b"", True) in host.wire.sent  # our side of the CONNECT stream ends too
    assert not wt.is_session(SESSION) and not wt.carries(4)


async def test_the_response_head_is_a_json_status_line_on_the_raw_stream() -> None:
    host, wt = sessions()
    wt.open_session(connect())
    wt.stream_data(data(4, head_line()))
    wt.write_head(4, [(b":status", b"200"), (b"content-type", b"text/event-stream")])
    line = host.wire.body(4)
    assert line.endswith(b"\n")
    assert json.loads(line) == {"status": 200, "headers": {"content-type": "text/event-stream"}, "stream_id": 4}
