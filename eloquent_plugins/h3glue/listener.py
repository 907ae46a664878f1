"""The HTTP/3 front end's listener: aioquic's ``QuicServer`` hardened against floods of fake Initials and against
peers that hold many connections (``GuardedQuicServer``; its connection caps are ``h3glue.connection_caps``), and
the server connection that issues QUIC-LB connection ids (``RoutableQuicConnection``). Server only: the client
never imports this module (tests/client/test_client_no_listener.py). The aioquic internals it copies are pinned in
``_UPSTREAM``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from aioquic.asyncio import server as aioquic_server
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.asyncio.server import QuicServer
from aioquic.buffer import Buffer
from aioquic.quic.configuration import SMALLEST_MAX_DATAGRAM_SIZE
from aioquic.quic.connection import TRANSPORT_CLOSE_FRAME_CAPACITY, QuicConnection, QuicConnectionId
from aioquic.quic.crypto import CryptoPair
from aioquic.quic.packet import (
    QuicErrorCode,
    QuicFrameType,
    QuicPacketType,
    encode_quic_retry,
    encode_quic_version_negotiation,
    pull_quic_header,
)
from aioquic.quic.packet_builder import QuicPacketBuilder

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.h3glue.common import (
    abandon,
    connection_of,
    handshake_complete,
    initial_decrypts,
    nothing_decrypted,
)
from eloquent_plugins.h3glue.connection_caps import ConnectionCaps

_encode_invalid_token_close = getattr(aioquic_server, "_encode_invalid_token_close", None)


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
    refused: int = 0
    """Answered with CONNECTION_REFUSED (0x2): the address held ``max_connections_per_address``, or the listener
    ``max_connections``, and none of them had been idle (no stream) for a second."""
    evicted: int = 0
    """Idle connections closed with H3_EXCESSIVE_LOAD (0x107) to make room for a new one under a connection cap."""
    idle_closed: int = 0
    """Connections closed with H3_NO_ERROR after carrying no stream for the idle timeout (PINGs do not count)."""


def encode_refusal(version: int, source_cid: bytes, destination_cid: bytes, reason: str) -> bytes:
    """A server Initial that closes the connection with CONNECTION_REFUSED and ``reason``, made without a
    connection (as aioquic's INVALID_TOKEN close: keys from the client's destination cid, ``source_cid``). An
    Initial may carry only a transport close (RFC 9000 section 10.2.3), hence not H3_EXCESSIVE_LOAD."""
    crypto = CryptoPair()
    crypto.setup_initial(cid=source_cid, is_client=False, version=version)
    builder = QuicPacketBuilder(host_cid=source_cid, is_client=False, max_datagram_size=SMALLEST_MAX_DATAGRAM_SIZE,
                                peer_cid=destination_cid, version=version)
    builder.start_packet(QuicPacketType.INITIAL, crypto)
    phrase = reason.encode()[:200]
    buf = builder.start_frame(QuicFrameType.TRANSPORT_CLOSE, capacity=TRANSPORT_CLOSE_FRAME_CAPACITY + len(phrase))
    buf.push_uint_var(QuicErrorCode.CONNECTION_REFUSED)
    buf.push_uint_var(QuicFrameType.PADDING)
    buf.push_uint_var(len(phrase))
    buf.push_bytes(phrase)
    datagrams, _ = builder.flush()
    return datagrams[0]


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
      sending anything (upstream keeps it for the full idle timeout);
    - connections, handshaking or open, are capped in total (``max_connections``) and per source address
      (``max_connections_per_address``): at a cap, the connection idle longest (no stream for at least a second;
      of the same address for its cap) is closed with H3_EXCESSIVE_LOAD for the newcomer, and when none is idle
      the newcomer's Initial is answered with CONNECTION_REFUSED; a connection that carries a stream is never
      closed for a newcomer;
    - a connection that carries no stream for ``streamless_timeout`` (default: the idle timeout) is closed with
      H3_NO_ERROR even if the peer keeps it alive with PINGs (``connection_caps`` says why aioquic's timer
      cannot).
    """

    def __init__(self, *, retry: str = "auto", retry_threshold: int = 64, max_handshakes: int = 512,
                 max_handshakes_per_address: int = 16, handshake_timeout: float = 10.0,
                 max_connections: int = 2048, max_connections_per_address: int = 128,
                 streamless_timeout: float | None = None, new_cid: Callable[[], bytes] | None = None,
                 **kwargs: Any) -> None:
        """``new_cid``: issue connection ids from it (``RoutableQuicConnection``; the Retry's too)."""
        if retry not in RETRY_MODES:
            raise ConfigError(f"retry must be one of {', '.join(RETRY_MODES)}, not {retry!r}")
        if min(retry_threshold, max_handshakes, max_handshakes_per_address) < 1 or not handshake_timeout > 0:
            raise ConfigError("handshake limits must be >= 1 and handshake_timeout > 0")
        if min(max_connections, max_connections_per_address) < 1:
            raise ConfigError("max_connections and max_connections_per_address must be >= 1")
        if streamless_timeout is not None and not streamless_timeout > 0:
            raise ConfigError("streamless_timeout must be > 0")
        super().__init__(retry=retry != "off", **kwargs)
        self.retry_mode = retry
        self.retry_threshold = retry_threshold
        self.max_handshakes = max_handshakes
        self.max_handshakes_per_address = max_handshakes_per_address
        self.handshake_timeout = handshake_timeout
        self.new_cid = new_cid
        self.stats = AdmissionStats()
        self.caps = ConnectionCaps(self._loop, self.stats, max_connections=max_connections,
                                   max_per_address=max_connections_per_address,
                                   idle_timeout=streamless_timeout or self._configuration.idle_timeout)
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
        self.caps.close()
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
            if protocol not in self._handshakes:
                self.caps.observe(protocol)
            elif handshake_complete(connection_of(protocol)):
                self._handshake_over(protocol)
                self.caps.opened(protocol)
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
        refusal = self.caps.refusal(key)
        if refusal is not None:
            self.stats.refused += 1
            self._transport.sendto(encode_refusal(  # type: ignore[union-attr]
                header.version, header.destination_cid, header.source_cid, refusal), addr)
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
        self.caps.admitted(protocol, key)
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
            self.caps.opened(protocol)
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
        self.caps.released(protocol)
        for cid in self._cids.pop(protocol, ()):
            if self._protocols.get(cid) is protocol:
                del self._protocols[cid]
