"""The HTTP/3 front end (aioquic): any ASGI app over HTTP/3, with Eloquent datagram delivery on request.

A request with ``eloquent-transport: datagram`` gets its ``text/event-stream`` response as Eloquent packets in
HTTP/3 datagrams tied to the request; ``eloquent-scheme`` picks ``eloquent`` (default), ``duplicate`` or
``stream``. See docs/QUIC.md.
"""

from eloquent_plugins.core.control import ControlParser, Fallback, StreamDigest, Trailer
from eloquent_plugins.core.protocol import DATAGRAM, REQUEST_ID_HEADER, SCHEME_HEADER, TRANSPORT_HEADER
from eloquent_plugins.core.response_stream import EloquentResponseStream
from eloquent_plugins.core.scheme import Scheme, UnknownScheme, scheme_for, sender_config_for
from eloquent_plugins.h3glue.common import ALPN, DatagramH3Connection, close_code
from eloquent_plugins.transports.http3.certs import CertificatePair, dev_certificate, resolve_certificate
from eloquent_plugins.transports.http3.datagram_queue import DatagramQueue
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.http3.server import Http3Server, start_http3_server

__all__ = [
    "ALPN", "DATAGRAM", "REQUEST_ID_HEADER", "SCHEME_HEADER", "TRANSPORT_HEADER", "CertificatePair",
    "ControlParser", "DatagramH3Connection", "DatagramQueue", "EloquentResponseStream", "Fallback",
    "FrontEndOptions", "Http3Server", "Scheme", "StreamDigest", "Trailer", "UnknownScheme", "close_code",
    "dev_certificate", "resolve_certificate", "scheme_for", "sender_config_for", "start_http3_server",
]
