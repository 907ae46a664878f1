"""A ``GuardedQuicServer`` in memory, and real aioquic clients that talk to it through a list of datagrams: the
listener's admission tests (tests/transports/http3/test_quic_flood.py, test_quic_connection_caps.py)."""

from __future__ import annotations

import ssl
import time
from typing import Any

from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from aioquic.quic.events import HandshakeCompleted

from eloquent_plugins.h3glue.common import ALPN
from eloquent_plugins.h3glue.listener import GuardedQuicServer
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.http3.server import quic_server_configuration

SERVER = ("127.0.0.1", 4433)


class Wire:
    """The listener's transport, in memory: what it sends is kept."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, Any]] = []

    def sendto(self, data: bytes, addr: Any = None) -> None:
        self.sent.append((bytes(data), addr))

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return SERVER if name == "sockname" else default

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def take(self, addr: Any) -> list[bytes]:
        mine = [data for data, to in self.sent if to == addr]
        self.sent = [(data, to) for data, to in self.sent if to != addr]
        return mine


def listener(**limits: Any) -> tuple[GuardedQuicServer, Wire]:
    server = GuardedQuicServer(configuration=quic_server_configuration(StreamConfig(), FrontEndOptions()),
                               create_protocol=QuicConnectionProtocol, **limits)
    wire = Wire()
    server.connection_made(wire)  # type: ignore[arg-type]
    return server, wire


def quic_client() -> QuicConnection:
    config = QuicConfiguration(alpn_protocols=ALPN, is_client=True)
    config.verify_mode = ssl.CERT_NONE
    client = QuicConnection(configuration=config)
    client.connect(SERVER, now=time.monotonic())
    return client


def send_initial(server: GuardedQuicServer, client: QuicConnection, addr: Any) -> None:
    for data, _ in client.datagrams_to_send(now=time.monotonic()):
        server.datagram_received(data, addr)


def handshake(server: GuardedQuicServer, wire: Wire, client: QuicConnection, addr: Any) -> bool:
    """Play the client side in memory until its handshake completes (a Retry is followed like any client)."""
    for _ in range(20):
        send_initial(server, client, addr)
        for data in wire.take(addr):
            client.receive_datagram(data, SERVER, now=time.monotonic())
        while (event := client.next_event()) is not None:
            if isinstance(event, HandshakeCompleted):
                send_initial(server, client, addr)  # the client's Finished
                return True
    return False
