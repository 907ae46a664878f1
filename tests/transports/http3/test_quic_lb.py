"""``--server-id`` (issue 25): the HTTP/3 front end issues connection ids carrying its server id in the QUIC-LB
plaintext layout (draft-ietf-quic-load-balancers). The server id is decoded, as a load balancer would, from every
connection id a real client was given: the Retry's, the handshake's and every NEW_CONNECTION_ID's."""

from __future__ import annotations

import pytest
from eloquent_client import EloquentClient

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.quic_lb import QuicLbConfig, decode, parse_server_id
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.h3glue.listener import RoutableQuicConnection
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.http3.server import start_http3_server
from tests.support.client_servers import CHAT, chat_body

SERVER_ID = bytes.fromhex("0a1b")


def test_layout_round_trips_and_refuses_what_the_draft_forbids() -> None:
    config = QuicLbConfig(SERVER_ID, config_rotation=2)
    cid = config.new_cid(lambda n: b"\xee" * n)
    assert cid == bytes([0b010_00111]) + SERVER_ID + b"\xee" * 5 and config.cid_length == 8
    assert decode(cid, 2) == (2, SERVER_ID)
    assert QuicLbConfig(bytes(range(1, 10))).cid_length == 1 + 9 + 4, "the nonce keeps its four octets"
    with pytest.raises(ValueError, match="unroutable"):
        decode(bytes([0b111_00111]) + cid[1:], 2)
    with pytest.raises(ValueError, match="length bits"):
        decode(cid + b"\x00", 2)
    for bad in (b"", bytes(16)):
        with pytest.raises(ConfigError):
            QuicLbConfig(bad)
    with pytest.raises(ConfigError):
        QuicLbConfig(SERVER_ID, config_rotation=7)
    with pytest.raises(ConfigError):
        QuicLbConfig(SERVER_ID, nonce_length=3)
    assert parse_server_id("0x0A1B") == SERVER_ID
    with pytest.raises(ConfigError):
        parse_server_id("xyz")


async def test_every_connection_id_a_client_gets_carries_the_server_id() -> None:
    app = create_engine_app(EngineConfig(ttft=0.01, tpot=0.002))
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig(),
                                   options=FrontEndOptions(retry="always", server_id=SERVER_ID))
    try:
        async with EloquentClient(f"https://127.0.0.1:{srv.port}", verify=False, timeout=10,
                                  transport="eloquent") as client:
            async with client.stream("POST", CHAT, json=chat_body("routable ids", 20)) as stream:
                assert await stream.text()
            quic = client._paths.conn._protocol._quic  # type: ignore[union-attr]  # the client's view of what it was issued
            given = [quic._peer_cid.cid, *(c.cid for c in quic._peer_cid_available)]
            retry_cid = quic._retry_source_connection_id
            server_side = [c for conn in list(srv._state.connections) for c in conn.quic.issued_cids]
        assert srv.admission.retried >= 1 and retry_cid is not None, "a Retry was sent"
        assert len(given) >= 4, f"the handshake's id and NEW_CONNECTION_ID ones, got {len(given)}"
        assert all(isinstance(conn.quic, RoutableQuicConnection) for conn in srv._state.connections)
        for cid in [retry_cid, *given, *server_side]:
            assert len(cid) == QuicLbConfig(SERVER_ID).cid_length
            assert decode(cid, len(SERVER_ID)) == (0, SERVER_ID), cid.hex()
        assert len(set(given)) == len(given), "each id is new (random nonce)"
    finally:
        await srv.close()
