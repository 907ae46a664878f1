"""aioquic glue both ends share, and the place in the package that touches aioquic's private attributes (the
server's hardened listener, ``h3glue.listener``, subclasses aioquic's ``QuicServer`` and uses these helpers; the
client never loads it).

aioquic exposes no public API for what the Eloquent front end needs (the congestion window, its DATAGRAM queue,
a probe flag, the peer's DATAGRAM frame limit and HTTP/3 settings, the protocol's connection, loop and timer), so
every such access lives here, next to the aioquic version range it was checked on (pyproject.toml pins it). The
protocol constants (header names, close codes, the datagram budget) are in ``core.protocol``.

aioquic only sends ``SETTINGS_H3_DATAGRAM=1`` together with WebTransport; a peer that follows RFC 9297 must not
send HTTP/3 datagrams unless the setting was received, so ``DatagramH3Connection`` adds it on its own.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from aioquic import tls
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.buffer import encode_uint_var
from aioquic.h3.connection import FrameType, H3Connection, Setting, encode_frame
from aioquic.quic.connection import QuicConnection, QuicConnectionState
from aioquic.quic.crypto import CryptoError, CryptoPair
from aioquic.quic.events import ConnectionTerminated
from aioquic.quic.packet import QuicErrorCode, QuicFrameType

from eloquent_plugins.core.errors import ProtocolError

if TYPE_CHECKING:
    from aioquic.asyncio.server import QuicServer

ALPN = ["h3"]

CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                 b"upgrade"})
"""Fields RFC 9114 section 4.2 forbids; an app that sets one (sse-starlette does) would break HTTP/3."""

DATAGRAM_FRAME_OVERHEAD = 8
"""Bytes aioquic's queue charges per pending DATAGRAM frame on top of its payload (frame type and length)."""


class NoPacer:
    """Stands in for aioquic's ``QuicPacketPacer``, which charges every packet as a full-size one: a stream of
    150-byte token packets is then held to cwnd / srtt / 1350 packets per second (20/s at the minimum window and
    100 ms RTT, below one token stream's rate) and each packet waits up to a pacing slot. The congestion window
    still bounds the bytes in flight; only the smoothing goes."""

    packet_time = None

    def next_send_time(self, now: float) -> None:
        return None

    def update_after_send(self, now: float) -> None:
        pass

    def update_bucket(self, now: float) -> None:
        pass

    def update_rate(self, congestion_window: int, smoothed_rtt: float) -> None:
        pass


def disable_pacing(quic: QuicConnection) -> None:
    quic._loss._pacer = NoPacer()  # type: ignore[assignment]


def close_code(error: ProtocolError) -> int:
    """The QUIC application error code a connection closes with for an Eloquent protocol error."""
    return int(error.code)


# ---- QuicConnection state aioquic keeps private -------------------------------------------------------------
def congestion_window(quic: QuicConnection) -> int:
    return int(quic._loss.congestion_window)


def smoothed_rtt(quic: QuicConnection) -> float | None:
    """aioquic's smoothed RTT of the connection; None before its first sample (the handshake gives one)."""
    loss = quic._loss
    return float(loss._rtt_smoothed) if loss._rtt_initialized else None


def bytes_in_flight(quic: QuicConnection) -> int:
    """Bytes of ack-eliciting packets aioquic has sent and not yet seen acknowledged or declared lost."""
    return int(quic._loss.bytes_in_flight)


def packet_numbers(quic: QuicConnection) -> tuple[int, int]:
    """The next packet number aioquic sends (one counter for every epoch) and the largest the peer acknowledged
    in the 1-RTT space (0 before any: a stream's mark after the handshake is above it)."""
    return quic._packet_number, quic._spaces[tls.Epoch.ONE_RTT].largest_acked_packet


def pending_datagram_bytes(quic: QuicConnection) -> int:
    """Payload bytes of the DATAGRAM frames aioquic holds, not yet sent (its queue has no bound or expiry)."""
    return sum(map(len, quic._datagrams_pending))


def has_pending_datagrams(quic: QuicConnection) -> bool:
    return bool(quic._datagrams_pending)


def datagram_room(quic: QuicConnection) -> int:
    """Bytes the congestion controller would let out now, minus what aioquic's DATAGRAM queue already holds."""
    loss = quic._loss
    queued = sum(len(d) + DATAGRAM_FRAME_OVERHEAD for d in quic._datagrams_pending)
    return int(loss.congestion_window - loss.bytes_in_flight - queued)


def acknowledge_now(quic: QuicConnection, now: float) -> None:
    """Have the next transmit carry the QUIC ACK of what was received instead of waiting for aioquic's ack timer
    (1 ms; RFC 9000 lets an ACK go early). The front end acknowledges a client's ack datagram in the transmit that
    follows its input: not in the next token's packet, where writing it (server) and processing it (client) come
    before the token's send and render (issue 19, docs/results/e2e-vs-sim.md)."""
    space = quic._spaces[tls.Epoch.ONE_RTT]
    if space.ack_at is not None and space.ack_at > now:
        space.ack_at = now


def request_probe(quic: QuicConnection) -> None:
    """Have aioquic send a probe packet now, which RFC 9002 section 7 lets exceed the congestion window."""
    quic._probe_pending = True


def peer_max_datagram_frame_size(quic: QuicConnection) -> int | None:
    """The peer's ``max_datagram_frame_size`` transport parameter (None: it takes no DATAGRAM frames)."""
    return quic._remote_max_datagram_frame_size  # type: ignore[no-any-return]


def stream_send_backlog(quic: QuicConnection, stream_id: int) -> int:
    """Bytes written on a stream and not yet acknowledged by the peer (0 for a stream aioquic forgot)."""
    stream = quic._streams.get(stream_id)
    if stream is None:
        return 0
    sender = stream.sender
    return int(sender._buffer_stop - sender._buffer_start)


def stream_alive(quic: QuicConnection, stream_id: int) -> bool:
    """aioquic still keeps the stream: frames for it may still arrive (those of a discarded one never reach us)."""
    return stream_id in quic._streams


def peer_address(quic: QuicConnection) -> tuple[Any, ...] | None:
    """(host, port) of the peer's current network path."""
    paths = quic._network_paths
    return tuple(paths[0].addr[:2]) if paths else None


def server_sockname(server: QuicServer) -> Any:
    """The listening socket's address (the bound port when 0 was asked for), None before it is bound."""
    transport = server._transport
    return transport.get_extra_info("sockname") if transport else None


def connection_of(protocol: QuicConnectionProtocol) -> QuicConnection:
    """The ``QuicConnection`` an asyncio protocol drives (for code that does not subclass ``H3Protocol``)."""
    return protocol._quic


def handshake_complete(quic: QuicConnection) -> bool:
    return bool(quic._handshake_complete)


def live_client_streams(quic: QuicConnection) -> bool:
    """A server connection has a bidirectional stream its client opened that QUIC has not finished both ways
    (aioquic forgets a stream once both directions are done)."""
    return any(stream_id % 4 == 0 for stream_id in quic._streams)


def nothing_decrypted(quic: QuicConnection) -> bool:
    """No packet of the peer has been decrypted yet (a server leaves FIRSTFLIGHT on the first one)."""
    return quic._state is QuicConnectionState.FIRSTFLIGHT


def peer_closed(quic: QuicConnection) -> bool:
    """The peer sent CONNECTION_CLOSE: aioquic is draining (RFC 9000 section 10.2.2) and reports
    ``ConnectionTerminated`` only 3 x PTO later, but the peer will read nothing more from now on."""
    return quic._state is QuicConnectionState.DRAINING


def stop_driving(protocol: QuicConnectionProtocol) -> None:
    """Cancel aioquic's timer, a pending transmit and a connect waiter, so nothing of this connection runs after
    its transport is gone (a timer left armed fires into a closed transport: "Exception in callback
    QuicConnectionProtocol._handle_timer()")."""
    for handle in (protocol._timer, protocol._transmit_task):
        if handle is not None:
            handle.cancel()
    protocol._timer = protocol._timer_at = protocol._transmit_task = None
    waiter = protocol._connected_waiter
    protocol._connected_waiter = None
    if waiter is not None and not waiter.done():
        waiter.cancel()


def initial_decrypts(data: bytes, header: Any, encrypted_off: int) -> bool:
    """Whether the datagram's first packet, a client Initial, decrypts with the keys its destination cid gives
    (stateless: about 35 us, against 250 us for the connection upstream would create first)."""
    crypto = CryptoPair()
    try:
        crypto.setup_initial(cid=header.destination_cid, is_client=False, version=header.version)
        crypto.decrypt_packet(data[:header.packet_length], encrypted_off, 0)
    except (CryptoError, ValueError):
        return False
    return True


def abandon(protocol: QuicConnectionProtocol, reason: str) -> None:
    """End a connection at once without sending anything (as aioquic's idle timeout does): the protocol sees
    ``ConnectionTerminated`` and its terminated handler runs, then its timer is cancelled."""
    quic = protocol._quic
    if quic._state is not QuicConnectionState.TERMINATED:
        if quic._close_event is None:
            quic._close_event = ConnectionTerminated(error_code=QuicErrorCode.INTERNAL_ERROR,
                                                     frame_type=QuicFrameType.PADDING, reason_phrase=reason)
        quic._close_end()
        protocol._process_events()
    stop_driving(protocol)


class H3Protocol(QuicConnectionProtocol):
    """A ``QuicConnectionProtocol`` with public names for what subclasses use (aioquic keeps them private) and
    two hooks: ``after_input()`` after each UDP datagram's events (default: transmit) and ``after_timer()``
    after aioquic's own timer ran."""

    @property
    def quic(self) -> QuicConnection:
        return self._quic

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def sockname(self) -> Any:
        """The local socket address (None before the transport is up)."""
        return self._transport.get_extra_info("sockname") if self._transport else None

    def transmit_soon(self) -> None:
        """Coalesce several writes into one transmit on the next loop iteration."""
        self._transmit_soon()

    def acknowledge_now(self) -> None:
        """The next transmit carries QUIC's ACK of what arrived (see ``acknowledge_now``)."""
        acknowledge_now(self._quic, self._loop.time())

    def stop_driving(self) -> None:
        """See ``stop_driving``: call before closing the transport of a connection that did not end cleanly."""
        stop_driving(self)

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        self._quic.receive_datagram(data, addr, now=self._loop.time())  # type: ignore[arg-type]
        self._process_events()
        self.after_input()

    def _handle_timer(self) -> None:
        super()._handle_timer()
        self.after_timer()

    def after_input(self) -> None:
        self.transmit()

    def after_timer(self) -> None:
        pass


# WebTransport over HTTP/3 (draft-ietf-webtrans-http3) settings of the drafts after draft-02, which aioquic 1.7.2
# does not know (aioquic issue 644). Each engine looks for its own: Chromium accepts draft-02's
# ENABLE_WEBTRANSPORT, Safari 26.4+ needs draft-13/14's WT_MAX_SESSIONS (and, as a draft-15 peer, the initial
# flow-control limits, else it may open no stream). tests/transports/http3/test_webtransport_settings.py pins them.
SETTINGS_WEBTRANSPORT_MAX_SESSIONS_DRAFT07 = 0xC671706A
"""draft-07 to -12: ``SETTINGS_WEBTRANSPORT_MAX_SESSIONS``."""
SETTINGS_WT_MAX_SESSIONS = 0x14E9CD29
"""draft-13 and -14: ``SETTINGS_WT_MAX_SESSIONS`` (section 9.2), at least 1 for Safari."""
SETTINGS_WT_ENABLED = 0x2C7CF000
"""draft-15 and later: ``SETTINGS_WT_ENABLED`` (1: WebTransport on)."""
SETTINGS_WT_INITIAL_MAX_DATA = 0x2B61
SETTINGS_WT_INITIAL_MAX_STREAMS_UNI = 0x2B64
SETTINGS_WT_INITIAL_MAX_STREAMS_BIDI = 0x2B65
WT_MAX_SESSIONS = 1
"""One session per connection: a larger value asks the peer for the draft's per-session flow control (draft-14
section 5), which this server does not implement; a browser opens another connection for another session."""
WT_INITIAL_LIMIT = 1 << 60
"""The session's initial stream and data limits: as large as quic-go's, since no per-session flow control runs here
(QUIC's own connection and stream limits still apply)."""


def webtransport_settings() -> dict[int, int]:
    """The WebTransport settings of the drafts after draft-02, sent beside aioquic's draft-02 ones."""
    return {SETTINGS_WEBTRANSPORT_MAX_SESSIONS_DRAFT07: WT_MAX_SESSIONS, SETTINGS_WT_MAX_SESSIONS: WT_MAX_SESSIONS,
            SETTINGS_WT_ENABLED: 1, SETTINGS_WT_INITIAL_MAX_DATA: WT_INITIAL_LIMIT,
            SETTINGS_WT_INITIAL_MAX_STREAMS_UNI: WT_INITIAL_LIMIT,
            SETTINGS_WT_INITIAL_MAX_STREAMS_BIDI: WT_INITIAL_LIMIT}


class DatagramH3Connection(H3Connection):
    """H3Connection announcing ``SETTINGS_H3_DATAGRAM`` (needs ``max_datagram_frame_size`` in the QUIC
    configuration)."""

    def __init__(self, quic: QuicConnection, *, webtransport: bool = False) -> None:
        """``webtransport``: also announce WebTransport (aioquic's draft-02 ``ENABLE_WEBTRANSPORT``, which
        Chromium and Firefox take, and the later drafts' settings, which Safari needs) and parse WebTransport
        streams."""
        self._webtransport = webtransport  # before super(): its __init__ sends the SETTINGS frame
        super().__init__(quic, enable_webtransport=webtransport)

    def _get_local_settings(self) -> dict[int, int]:
        settings = super()._get_local_settings()
        settings[Setting.H3_DATAGRAM] = 1
        if self._webtransport:
            settings.update(webtransport_settings())
        return settings

    @property
    def peer_accepts_datagrams(self) -> bool:
        """The peer sent ``SETTINGS_H3_DATAGRAM=1`` and QUIC negotiated DATAGRAM frames."""
        settings = self._received_settings or {}
        return settings.get(Setting.H3_DATAGRAM) == 1 and peer_max_datagram_frame_size(self._quic) is not None

    @property
    def settings_received(self) -> bool:
        return self._received_settings is not None

    def send_goaway(self, stream_id: int) -> bool:
        """HTTP/3 GOAWAY (RFC 9114 section 5.2) on our control stream: requests on ``stream_id`` and above will
        not be served here, the client opens a new connection for them. aioquic has no public API for it (its
        client ignores a GOAWAY it receives, which is allowed). False before the control stream exists."""
        control = self._local_control_stream_id
        if control is None:
            return False
        self._quic.send_stream_data(control, encode_frame(FrameType.GOAWAY, encode_uint_var(stream_id)))
        return True
