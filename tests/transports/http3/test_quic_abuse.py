"""A misbehaving client gets its connection closed with a QUIC error code; other connections go on."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable

import pytest
from eloquent_client import EloquentClient, H3Stream, Http3ClientConnection

from eloquent_plugins.core.errors import DecodeError, LimitExceeded, ProtocolViolation
from eloquent_plugins.h3glue.common import connection_of
from eloquent_plugins.transports.http3.server import Http3Server
from eloquent_plugins.core.wire import AckPacket, encode_packet

BODY = {"model": "eloquent-builtin", "messages": [{"role": "user", "content": "abuse"}], "stream": True,
        "max_tokens": 150}


@pytest.fixture
async def server(h3_engine: Callable[..., Awaitable[Http3Server]]) -> Http3Server:
    return await h3_engine(ttft=0.01, tpot=0.01)


async def open_eloquent(srv: Http3Server) -> tuple[Http3ClientConnection, H3Stream]:
    conn = await Http3ClientConnection.connect("127.0.0.1", srv.port, verify=False)
    stream = await conn.request("POST", "/v1/chat/completions", body=json.dumps(BODY).encode(), eloquent=True,
                                headers=[("eloquent-transport", "datagram")])
    await stream.wait_headers(5)
    assert stream.eloquent
    events = stream.events()
    await events.__anext__()  # the server has sent at least one data packet
    return conn, stream


def garbage(stream_id: int) -> list[bytes]:
    return [b"\x07not an eloquent packet"]


def ack_from_the_future(stream_id: int) -> list[bytes]:
    return [encode_packet(AckPacket(stream_id, next_expected=100_000, largest_packet_number=0, ack_delay=0.0))]


def ack_flood(stream_id: int) -> list[bytes]:
    return [encode_packet(AckPacket(stream_id, next_expected=0, largest_packet_number=0, ack_delay=0.0))] * 400


def unroutable_flood(stream_id: int) -> list[bytes]:
    return [encode_packet(AckPacket(stream_id + 400, 0, 0, 0.0))] * 2000


@pytest.mark.parametrize("attack,code", [
    (garbage, DecodeError.code), (ack_from_the_future, ProtocolViolation.code), (ack_flood, LimitExceeded.code),
    (unroutable_flood, LimitExceeded.code),
])
async def test_attack_closes_only_the_attacker(server: Http3Server, attack: Callable[[int], list[bytes]],
                                               code: int) -> None:
    async with EloquentClient(f"https://127.0.0.1:{server.port}", verify=False) as good:
        async with good.stream("POST", "/v1/chat/completions", json=BODY) as honest:
            bad, stream = await open_eloquent(server)
            try:
                target = stream.stream_id + (400 if attack is unroutable_flood else 0)
                bad.send_raw_datagrams(target, attack(stream.stream_id))
                await bad.wait_closed(5)
                assert bad.close_event is not None and bad.close_event.error_code == code
            finally:
                await bad.close()
            text = await honest.text()
    assert len(text) > 100 and honest.rendered[-1].data == "[DONE]"
    assert server.connections_closed_with_error == 1


async def test_datagram_with_unparseable_quarter_stream_id_closes_with_h3_datagram_error(
        server: Http3Server) -> None:
    bad = await Http3ClientConnection.connect("127.0.0.1", server.port, verify=False)
    try:
        connection_of(bad._protocol).send_datagram_frame(b"\xff")
        bad._protocol.transmit()
        await bad.wait_closed(5)
        assert bad.close_event is not None and bad.close_event.error_code == 0x33
    finally:
        await bad.close()
    async with EloquentClient(f"https://127.0.0.1:{server.port}", verify=False) as good:
        assert (await good.request("GET", "/health")).status == 200


async def test_late_acks_for_a_finished_stream_are_tolerated(server: Http3Server) -> None:
    async with EloquentClient(f"https://127.0.0.1:{server.port}", verify=False) as client:
        async with client.stream("POST", "/v1/chat/completions", json={**BODY, "max_tokens": 5}) as s:
            await s.text()
            stream_id = s.h3.stream_id
        await asyncio.sleep(0.2)
        conn = await client.connection()
        # A few stragglers: dropped, not punished.
        conn.send_raw_datagrams(stream_id, [encode_packet(AckPacket(stream_id, 1, 0, 0.0))] * 20)
        await asyncio.sleep(0.2)
        assert not conn.closed
        async with client.stream("POST", "/v1/chat/completions", json={**BODY, "max_tokens": 5}) as s:
            assert (await s.text())
