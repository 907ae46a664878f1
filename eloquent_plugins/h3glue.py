# long: every access to aioquic internals lives in this one module, the hardened QuicServer included
"""aioquic glue both ends share, and the ONE place in the package that touches aioquic's private attributes
(including ``GuardedQuicServer``, the front end's listener: aioquic's ``QuicServer`` hardened against floods of
fake Initials).

aioquic exposes no public API for what the Eloquent front end needs (the congestion window, its DATAGRAM queue,
a probe flag, the peer's DATAGRAM frame limit and HTTP/3 settings, the protocol's connection, loop and timer), so
every such access lives here, next to the aioquic version range it was checked on (pyproject.toml pins it). The
protocol constants (header names, close codes, the datagram budget) are in ``core.protocol``.

aioquic only sends ``SETTINGS_H3_DATAGRAM=1`` together with WebTransport; a peer that follows RFC 9297 must not
send HTTP/3 datagrams unless the setting was received, so ``DatagramH3Connection`` adds it on its own.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from collections.abc import Callable
from functools import partial
from typing import Any

from aioquic import tls
from aioquic.asyncio import server as aioquic_server
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.buffer import Buffer
from aioquic.buffer import encode_uint_var
from aioquic.h3.connection import FrameType, H3Connection, Setting, encode_frame
from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE
from aioquic.quic.connection import QuicConnection, QuicConnectionId, QuicConnectionState
from aioquic.quic.crypto import CryptoError, CryptoPair
from aioquic.quic.events import ConnectionTerminated
from aioquic.quic.packet import (
    QuicErrorCode,
    QuicFrameType,
    QuicPacketType,
    encode_quic_retry,
    encode_quic_version_negotiation,
    pull_quic_header,
)

from eloquent_plugins.core.errors import ConfigError, ProtocolError

_encode_invalid_token_close = getattr(aioquic_server, "_encode_invalid_token_close", None)

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


def nothing_decrypted(quic: QuicConnection) -> bool:
    """No packet of the peer has been decrypted yet (a server leaves FIRSTFLIGHT on the first one)."""
    return quic._state is QuicConnectionState.FIRSTFLIGHT


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


class RoutableQuicConnection(QuicConnection):
    """A server connection whose connection ids come from ``new_cid`` (``core.quic_lb``: the server id in the
    QUIC-LB layout) instead of aioquic's random ones: the one of the handshake and every NEW_CONNECTION_ID's."""

    def __init__(self, *, new_cid: Callable[[], bytes], **kwargs: Any) -> None:
        self._new_cid = new_cid
        super().__init__(**kwargs)
        first = self._host_cids[0]  # drawn at random by aioquic, not sent yet
        first.cid = new_cid()
        self.host_cid = self._local_initial_source_connection_id = first.cid

    def _replenish_connection_ids(self) -> None:
        while len(self._host_cids) < min(8, self._remote_active_connection_id_limit):
            self._host_cids.append(QuicConnectionId(cid=self._new_cid(), sequence_number=self._host_cid_seq,
                                                    stateless_reset_token=os.urandom(16)))
            self._host_cid_seq += 1

    @property
    def issued_cids(self) -> list[bytes]:
        """The connection ids this end has issued and not retired (for tests and diagnostics)."""
        return [c.cid for c in self._host_cids]


# ---- the listener: aioquic's QuicServer, hardened against floods of fake Initials ------------------------------
AIOQUIC_WRITTEN_AGAINST = "1.7.2"
RETRY_MODES = ("auto", "always", "off")

_UPSTREAM: dict[str, tuple[Any, str]] = {
    # What GuardedQuicServer copies from or relies on in aioquic, with the sha256 prefix of its source in 1.7.2;
    # ``aioquic_drift()`` (asserted empty by tests/transports/http3/test_quic_flood.py) names any that changed since.
    "QuicServer.__init__": (QuicServer.__init__, "3850146a41ca75b6"),
    "QuicServer.datagram_received": (QuicServer.datagram_received, "4440e39aaa1eeeb5"),
    "QuicServer._connection_id_issued": (QuicServer._connection_id_issued, "c971cc2375672b83"),
    "QuicServer._connection_id_retired": (QuicServer._connection_id_retired, "81a083c95aadc7a8"),
    "QuicServer._connection_terminated": (QuicServer._connection_terminated, "c97eb4c322136b30"),
    "QuicServer.close": (QuicServer.close, "0f8f03319e4dc62a"),
    "QuicConnectionProtocol.__init__": (QuicConnectionProtocol.__init__, "d18a3e316e9b4223"),
    "QuicConnectionProtocol._process_events": (QuicConnectionProtocol._process_events, "b597fcfc85d5cfd8"),
    "QuicConnectionProtocol.transmit": (QuicConnectionProtocol.transmit, "31b06ca7f4e21d2e"),
    "QuicConnection._close_end": (QuicConnection._close_end, "7e32d95840a68634"),
    "QuicConnection.receive_datagram": (QuicConnection.receive_datagram, "3c7f29826050cbfe"),
    # acknowledge_now: receive_datagram arms ``space.ack_at``; an ACK frame goes in the next 1-RTT packet once
    # ``ack_at <= now``.
    "QuicConnection._write_application": (QuicConnection._write_application, "c37bf64378f72b2f"),
    # RoutableQuicConnection: the host cids are drawn here (and the first one in __init__, replaced after it).
    "QuicConnection._replenish_connection_ids": (QuicConnection._replenish_connection_ids, "73b127efb89c53a3"),
}


def aioquic_drift() -> list[str]:
    """The aioquic internals ``GuardedQuicServer``, ``abandon`` and ``acknowledge_now`` rely on
    whose source is no longer the one they were written against (review them, then update the hashes)."""
    import hashlib
    import inspect

    changed = []
    for name, (obj, digest) in _UPSTREAM.items():
        if hashlib.sha256(inspect.getsource(obj).encode()).hexdigest()[:16] != digest:
            changed.append(name)
    return changed


@dataclass(slots=True)
class AdmissionStats:
    """What the listener did with Initials that opened no known connection (counters since start)."""

    admitted: int = 0
    """Connections created."""
    undecryptable: int = 0
    """Dropped silently, before any state: the Initial did not decrypt (its keys derive from its own destination
    cid, so only junk fails)."""
    retried: int = 0
    """Answered with a stateless Retry instead of a connection."""
    shed: int = 0
    """Dropped silently: a handshake cap was reached (``retry="off"``, or an address-validated one over the total)."""
    invalid_tokens: int = 0
    expired: int = 0
    """Handshakes not complete ``handshake_timeout`` after they began: dropped, nothing sent."""


class GuardedQuicServer(QuicServer):
    """aioquic's ``QuicServer`` with the defences a flood of fake QUIC Initials needs, written as the fix would go
    upstream, against aioquic 1.7.2 (``aioquic_drift()`` says when the copied internals change):

    - a closed connection's removal deletes only its own connection ids (its original destination or retry
      source cid and its host cids, each only if it still maps to it); upstream scans the whole map, so n closes
      cost n^2: 6,748 fake connections reaching the idle timeout together froze the event loop for a minute;
    - an Initial that does not decrypt is dropped before any state is made (upstream creates a connection and
      keeps it for the idle timeout: 78 KB each);
    - connections still in the handshake are capped in total and per source address: past a cap a new one is
      answered with a stateless Retry (``retry`` "auto"/"always") or dropped ("off"), never created; the ones
      already handshaking are kept;
    - stateless Retry (address validation, RFC 9000 section 8.1) when ``retry_threshold`` handshakes are under
      way ("auto") or always ("always"); an Initial carrying a token is always validated (unless "off"), so a
      retried client completes even after the load dropped;
    - a connection whose handshake is not complete ``handshake_timeout`` after it began is dropped without
      sending anything (upstream keeps it for the full idle timeout).
    """

    def __init__(self, *, retry: str = "auto", retry_threshold: int = 64, max_handshakes: int = 512,
                 max_handshakes_per_address: int = 16, handshake_timeout: float = 10.0,
                 new_cid: Callable[[], bytes] | None = None, **kwargs: Any) -> None:
        """``new_cid``: issue connection ids from it (``RoutableQuicConnection``; the Retry's too)."""
        if retry not in RETRY_MODES:
            raise ConfigError(f"retry must be one of {', '.join(RETRY_MODES)}, not {retry!r}")
        if min(retry_threshold, max_handshakes, max_handshakes_per_address) < 1 or not handshake_timeout > 0:
            raise ConfigError("handshake limits must be >= 1 and handshake_timeout > 0")
        super().__init__(retry=retry != "off", **kwargs)
        self.retry_mode = retry
        self.retry_threshold = retry_threshold
        self.max_handshakes = max_handshakes
        self.max_handshakes_per_address = max_handshakes_per_address
        self.handshake_timeout = handshake_timeout
        self.new_cid = new_cid
        self.stats = AdmissionStats()
        self._cids: dict[QuicConnectionProtocol, set[bytes]] = {}
        self._handshakes: dict[QuicConnectionProtocol, tuple[str, asyncio.TimerHandle]] = {}
        self._per_address: dict[str, int] = {}

    @property
    def handshaking(self) -> int:
        return len(self._handshakes)

    def set_configuration(self, configuration: Any) -> None:
        """New connections use ``configuration`` (a renewed certificate); live ones keep theirs."""
        self._configuration = configuration

    @property
    def connection_count(self) -> int:
        return len(self._cids)

    def close(self) -> None:
        for _, timer in self._handshakes.values():
            timer.cancel()
        self._handshakes.clear()
        self._per_address.clear()
        protocols = list(self._cids)
        self._cids.clear()
        for protocol in protocols:
            protocol.close()
        self._protocols.clear()
        if self._transport is not None:
            self._transport.close()

    def datagram_received(self, data: bytes | str, addr: Any) -> None:
        data = bytes(data) if not isinstance(data, bytes) else data
        buf = Buffer(data=data)
        try:
            header = pull_quic_header(buf, host_cid_length=self._configuration.connection_id_length)
        except ValueError:
            return
        if (header.packet_type != QuicPacketType.VERSION_NEGOTIATION and header.version is not None
                and header.version not in self._configuration.supported_versions):
            self._transport.sendto(encode_quic_version_negotiation(  # type: ignore[union-attr]
                source_cid=header.destination_cid, destination_cid=header.source_cid,
                supported_versions=self._configuration.supported_versions), addr)
            return
        protocol = self._protocols.get(header.destination_cid)
        if protocol is not None:
            protocol.datagram_received(data, addr)
            if protocol in self._handshakes and handshake_complete(protocol._quic):
                self._handshake_over(protocol)
            return
        if len(data) >= SMALLEST_MAX_DATAGRAM_SIZE and header.packet_type == QuicPacketType.INITIAL:
            self._accept(header, data, buf.tell(), addr)

    # ---- admission -------------------------------------------------------------------------------------------
    def _accept(self, header: Any, data: bytes, encrypted_off: int, addr: Any) -> None:
        if not initial_decrypts(data, header, encrypted_off):
            self.stats.undecryptable += 1
            return
        now = self._loop.time()
        original_cid: bytes = header.destination_cid
        retry_source_cid: bytes | None = None
        validated = False
        if header.token and self._retry is not None:
            try:
                original_cid = self._retry.validate_token(address=addr, destination_cid=header.destination_cid,
                                                          token=header.token, now=now)
            except ValueError:
                self.stats.invalid_tokens += 1
                if _encode_invalid_token_close is not None:  # RFC 9000 section 8.1.3
                    self._transport.sendto(_encode_invalid_token_close(  # type: ignore[union-attr]
                        version=header.version, source_cid=header.destination_cid,
                        destination_cid=header.source_cid), addr)
                return
            retry_source_cid = header.destination_cid
            validated = True
        key = str(addr[0])
        if not validated:
            busy = (len(self._handshakes) >= self.retry_threshold
                    or self._per_address.get(key, 0) >= self.max_handshakes_per_address)
            if self.retry_mode == "always" or (self.retry_mode == "auto" and busy):
                self._send_retry(header, addr, now)
                return
            if self._per_address.get(key, 0) >= self.max_handshakes_per_address:
                self.stats.shed += 1
                return
        if len(self._handshakes) >= self.max_handshakes:
            self.stats.shed += 1
            return
        settings: dict[str, Any] = {
            "configuration": self._configuration, "original_destination_connection_id": original_cid,
            "retry_source_connection_id": retry_source_cid, "session_ticket_fetcher": self._session_ticket_fetcher,
            "session_ticket_handler": self._session_ticket_handler}
        connection = (QuicConnection(**settings) if self.new_cid is None
                      else RoutableQuicConnection(new_cid=self.new_cid, **settings))
        protocol = self._create_protocol(connection, stream_handler=self._stream_handler)
        protocol.connection_made(self._transport)
        protocol._connection_id_issued_handler = partial(self._connection_id_issued, protocol=protocol)
        protocol._connection_id_retired_handler = partial(self._connection_id_retired, protocol=protocol)
        protocol._connection_terminated_handler = partial(self._connection_terminated, protocol=protocol)
        self._cids[protocol] = set()
        self._connection_id_issued(header.destination_cid, protocol)
        self._connection_id_issued(connection.host_cid, protocol)
        self._per_address[key] = self._per_address.get(key, 0) + 1
        self._handshakes[protocol] = (key, self._loop.call_later(self.handshake_timeout, self._expire, protocol))
        self.stats.admitted += 1
        protocol.datagram_received(data, addr)
        if nothing_decrypted(connection):
            abandon(protocol, "nothing decrypted")

    def _send_retry(self, header: Any, addr: Any, now: float) -> None:
        assert self._retry is not None and self._transport is not None
        source_cid = os.urandom(8) if self.new_cid is None else self.new_cid()
        token = self._retry.create_token(address=addr, original_destination_connection_id=header.destination_cid,
                                         retry_source_connection_id=source_cid, now=now)
        self._transport.sendto(encode_quic_retry(version=header.version, source_cid=source_cid,
                                                 destination_cid=header.source_cid,
                                                 original_destination_cid=header.destination_cid,
                                                 retry_token=token), addr)
        self.stats.retried += 1

    def _expire(self, protocol: QuicConnectionProtocol) -> None:
        if protocol not in self._handshakes:
            return
        if handshake_complete(protocol._quic):
            self._handshake_over(protocol)
            return
        self.stats.expired += 1
        abandon(protocol, "handshake timeout")

    def _handshake_over(self, protocol: QuicConnectionProtocol) -> None:
        record = self._handshakes.pop(protocol, None)
        if record is None:
            return
        key, timer = record
        timer.cancel()
        left = self._per_address[key] - 1
        if left:
            self._per_address[key] = left
        else:
            del self._per_address[key]

    # ---- connection ids: each protocol's own, so removal is O(its cids) -------------------------------------
    def _connection_id_issued(self, cid: bytes, protocol: QuicConnectionProtocol) -> None:
        self._protocols[cid] = protocol
        own = self._cids.get(protocol)
        if own is not None:
            own.add(cid)

    def _connection_id_retired(self, cid: bytes, protocol: QuicConnectionProtocol) -> None:
        if self._protocols.get(cid) is protocol:
            del self._protocols[cid]
        own = self._cids.get(protocol)
        if own is not None:
            own.discard(cid)

    def _connection_terminated(self, protocol: QuicConnectionProtocol) -> None:
        self._handshake_over(protocol)
        for cid in self._cids.pop(protocol, ()):
            if self._protocols.get(cid) is protocol:
                del self._protocols[cid]
