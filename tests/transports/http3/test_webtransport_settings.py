"""The HTTP/3 front end's SETTINGS frame, read off the wire by a real QUIC client, against the numbers of the
WebTransport drafts (draft-ietf-webtrans-http3): draft-02's ENABLE_WEBTRANSPORT (aioquic's; Chromium and Firefox
take it) and the later drafts' settings beside it (Safari 26.4+ needs WT_MAX_SESSIONS, aioquic issue 644).

The codepoints are written out here from the drafts' IANA sections, not imported, so a typo in h3glue.py fails."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.events import QuicEvent, StreamDataReceived

from eloquent_plugins.core.varint import decode_varint
from eloquent_plugins.h3glue.common import ALPN, DatagramH3Connection
from tests.support.serve_thread import ServeThread

# RFC 9114 section 7.2.4.1, RFC 9220, RFC 9297
SETTINGS_QPACK_MAX_TABLE_CAPACITY = 0x01
SETTINGS_ENABLE_CONNECT_PROTOCOL = 0x08
SETTINGS_H3_DATAGRAM = 0x33
# draft-ietf-webtrans-http3: -02 to -06, -07 to -12, -13/-14 (section 9.2), -15 and later (section 9.2)
SETTINGS_ENABLE_WEBTRANSPORT = 0x2B603742
SETTINGS_WEBTRANSPORT_MAX_SESSIONS_07 = 0xC671706A
SETTINGS_WT_MAX_SESSIONS = 0x14E9CD29
SETTINGS_WT_ENABLED = 0x2C7CF000
SETTINGS_WT_INITIAL_MAX_DATA = 0x2B61
SETTINGS_WT_INITIAL_MAX_STREAMS_UNI = 0x2B64
SETTINGS_WT_INITIAL_MAX_STREAMS_BIDI = 0x2B65
CONTROL_STREAM = 0x00
FRAME_SETTINGS = 0x04
VARINT_MAX = (1 << 62) - 1


class _Recorder(QuicConnectionProtocol):
    """A QUIC client that keeps the bytes of the server's unidirectional streams as they come."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.h3 = DatagramH3Connection(self._quic, webtransport=True)
        self.uni: dict[int, bytes] = {}
        self.settings = asyncio.get_running_loop().create_future()

    def quic_event_received(self, event: QuicEvent) -> None:
        if isinstance(event, StreamDataReceived) and event.stream_id % 4 == 3:  # server-initiated, unidirectional
            self.uni[event.stream_id] = self.uni.get(event.stream_id, b"") + event.data
            frame = settings_frame(self.uni[event.stream_id])
            if frame is not None and not self.settings.done():
                self.settings.set_result(frame)
        self.h3.handle_event(event)


def settings_frame(stream: bytes) -> list[tuple[int, int]] | None:
    """The (id, value) pairs of the SETTINGS frame a control stream begins with, in wire order; None until its
    bytes are all in (or for another stream type)."""
    try:
        kind, pos = decode_varint(stream, 0)
        if kind != CONTROL_STREAM:
            return None
        frame_type, pos = decode_varint(stream, pos)
        length, pos = decode_varint(stream, pos)
    except Exception:  # noqa: BLE001 - not all in yet
        return None
    assert frame_type == FRAME_SETTINGS, "RFC 9114 6.2.1: the control stream begins with SETTINGS"
    if len(stream) < pos + length:
        return None
    payload, pairs, at = stream[pos:pos + length], [], 0
    while at < len(payload):
        key, at = decode_varint(payload, at)
        value, at = decode_varint(payload, at)
        pairs.append((key, value))
    return pairs


@pytest.fixture(scope="module")
def server() -> Iterator[ServeThread]:
    with ServeThread() as thread:
        yield thread


async def _read_settings(port: int) -> list[tuple[int, int]]:
    config = QuicConfiguration(alpn_protocols=ALPN, is_client=True, max_datagram_frame_size=65536, verify_mode=0)
    async with connect("127.0.0.1", port, configuration=config, create_protocol=_Recorder) as protocol:
        assert isinstance(protocol, _Recorder)
        return await asyncio.wait_for(protocol.settings, 10)


def test_settings_frame_carries_every_drafts_webtransport_settings(server: ServeThread) -> None:
    pairs = asyncio.run(_read_settings(server.udp_port))
    settings = dict(pairs)
    assert len(settings) == len(pairs), f"a setting sent twice: {pairs}"  # RFC 9114 7.2.4: a connection error
    # HTTP/3 and its extensions that WebTransport needs (every draft)
    assert settings[SETTINGS_ENABLE_CONNECT_PROTOCOL] == 1
    assert settings[SETTINGS_H3_DATAGRAM] == 1
    # draft-02: what aioquic sends and Chromium/Firefox negotiate
    assert settings[SETTINGS_ENABLE_WEBTRANSPORT] == 1
    # draft-07..12 and draft-13/14: one session per connection (more would ask for per-session flow control)
    assert settings[SETTINGS_WEBTRANSPORT_MAX_SESSIONS_07] == 1
    assert settings[SETTINGS_WT_MAX_SESSIONS] == 1
    # draft-15+: a boolean, and the session's initial limits: absent would mean 0 (no stream could be opened)
    assert settings[SETTINGS_WT_ENABLED] == 1
    for limit in (SETTINGS_WT_INITIAL_MAX_DATA, SETTINGS_WT_INITIAL_MAX_STREAMS_UNI,
                  SETTINGS_WT_INITIAL_MAX_STREAMS_BIDI):
        assert 1 << 20 <= settings[limit] <= VARINT_MAX, (hex(limit), settings[limit])
    assert settings[SETTINGS_QPACK_MAX_TABLE_CAPACITY] >= 0
    known = {SETTINGS_QPACK_MAX_TABLE_CAPACITY, SETTINGS_ENABLE_CONNECT_PROTOCOL, SETTINGS_H3_DATAGRAM,
             SETTINGS_ENABLE_WEBTRANSPORT, SETTINGS_WEBTRANSPORT_MAX_SESSIONS_07, SETTINGS_WT_MAX_SESSIONS,
             SETTINGS_WT_ENABLED, SETTINGS_WT_INITIAL_MAX_DATA, SETTINGS_WT_INITIAL_MAX_STREAMS_UNI,
             SETTINGS_WT_INITIAL_MAX_STREAMS_BIDI, 0x07, 0x21}  # QPACK_BLOCKED_STREAMS; 0x21: reserved (grease, 7.2.4.1)
    assert set(settings) <= known, f"unexpected settings {[hex(k) for k in set(settings) - known]}"
