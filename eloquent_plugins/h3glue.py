"""HTTP/3 pieces both ends share: the header names of the Eloquent front end, error codes, and an
``H3Connection`` that announces RFC 9297 datagrams without WebTransport.

aioquic only sends ``SETTINGS_H3_DATAGRAM=1`` together with WebTransport; a peer that follows RFC 9297 must
not send HTTP/3 datagrams unless the setting was received, so this subclass adds it on its own.
"""

from __future__ import annotations

from aioquic.h3.connection import H3Connection, Setting
from aioquic.quic.connection import QuicConnection

from eloquent_plugins.core.errors import ProtocolError

ALPN = ["h3"]

TRANSPORT_HEADER = b"eloquent-transport"
"""Request: ``datagram`` asks for Eloquent datagrams; response: ``datagram`` confirms the body is control
records (see ``control``) and the events travel as HTTP/3 datagrams on this request."""
SCHEME_HEADER = b"eloquent-scheme"
"""Request: ``eloquent`` (default), ``duplicate`` or ``stream`` -- which delivery the front end uses."""
REQUEST_ID_HEADER = b"eloquent-request-id"
"""Response: an id for this request, to look up server-side timings in-process (benchmarks)."""
DATAGRAM = b"datagram"

# Application error codes for CONNECTION_CLOSE. Eloquent protocol errors close with ProtocolError.code
# (0x1 generic, 0x2 decode, 0x3 limit, 0x4 violation); those values are unassigned in the HTTP/3 registry.
H3_NO_ERROR = 0x100
H3_INTERNAL_ERROR = 0x102
H3_REQUEST_CANCELLED = 0x10C
H3_DATAGRAM_ERROR = 0x33

CONNECTION_SPECIFIC = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding",
                                 b"upgrade"})
"""Fields RFC 9114 section 4.2 forbids; an app that sets one (sse-starlette does) would break HTTP/3."""


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


class DatagramH3Connection(H3Connection):
    """H3Connection announcing ``SETTINGS_H3_DATAGRAM`` (needs ``max_datagram_frame_size`` in the QUIC
    configuration)."""

    def __init__(self, quic: QuicConnection) -> None:
        super().__init__(quic, enable_webtransport=False)

    def _get_local_settings(self) -> dict[int, int]:
        settings = super()._get_local_settings()
        settings[Setting.H3_DATAGRAM] = 1
        return settings

    @property
    def peer_accepts_datagrams(self) -> bool:
        """The peer sent ``SETTINGS_H3_DATAGRAM=1`` and QUIC negotiated DATAGRAM frames."""
        settings = self._received_settings or {}
        return settings.get(Setting.H3_DATAGRAM) == 1 and self._quic._remote_max_datagram_frame_size is not None

    @property
    def settings_received(self) -> bool:
        return self._received_settings is not None
