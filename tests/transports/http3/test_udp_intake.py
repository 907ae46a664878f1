"""``h3glue.intake.BatchedIntake``: a burst queued on a UDP socket is taken in batches at each wake-up, in order,
each datagram once; a transport closed mid-batch stops it; the HTTP/3 front end's listener reads through it.

Why it matters (issue 28): asyncio's datagram transport reads one datagram per loop iteration, so a busy or
starved server fell seconds behind its clients' ACKs and requests (``eloquent bench load --cpu-hog``: HTTP/3
requests unanswered for 60 s, resumes refused) while SSE over TCP, read whole at each wake-up, was not."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from eloquent_plugins.h3glue.intake import MAX_BATCH, BatchedIntake


class _Recorder(asyncio.DatagramProtocol):
    def __init__(self, close_after: int | None = None) -> None:
        self.received: list[bytes] = []
        self.close_after = close_after
        self.transport: asyncio.DatagramTransport | None = None
        self.lost = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.received.append(data)
        if self.close_after is not None and len(self.received) == self.close_after:
            assert self.transport is not None
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(exc)


async def _endpoint(protocol: _Recorder) -> tuple[asyncio.DatagramTransport, BatchedIntake, int]:
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(lambda: protocol,
                                                                             local_addr=("127.0.0.1", 0))
    transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
    intake = BatchedIntake.install(transport)
    assert intake is not None and transport.get_protocol() is intake
    return transport, intake, transport.get_extra_info("sockname")[1]


def _burst(port: int, n: int) -> list[bytes]:
    """``n`` datagrams queued on the endpoint's socket before its loop runs again (loopback delivers in sendto)."""
    sent = [b"datagram %d" % i for i in range(n)]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for data in sent:
            sender.sendto(data, ("127.0.0.1", port))
    return sent


async def _until(condition: Any, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)


async def test_a_queued_burst_is_taken_in_batches_in_order() -> None:
    protocol = _Recorder()
    transport, intake, port = await _endpoint(protocol)
    try:
        n = MAX_BATCH + 36
        sent = _burst(port, n)
        await _until(lambda: len(protocol.received) >= n)
        await asyncio.sleep(0.05)  # nothing more comes: each datagram delivered once
        assert protocol.received == sent
        # Two wake-ups: the transport's one datagram + 63 queued behind it, then one + the 35 left. One datagram
        # per wake-up (asyncio alone) would have needed 100.
        assert (intake.batches, intake.extra) == (2, n - 2)
    finally:
        transport.close()


async def test_a_transport_closed_mid_batch_stops_it_and_closes_the_duplicate() -> None:
    protocol = _Recorder(close_after=5)
    transport, intake, port = await _endpoint(protocol)
    _burst(port, 20)
    await asyncio.wait_for(protocol.lost, 10)
    assert len(protocol.received) == 5  # nothing delivered after the protocol closed its transport
    assert intake._sock is None  # the duplicate descriptor went with the transport


async def test_install_changes_nothing_for_a_transport_without_a_socket() -> None:
    class _Memory(asyncio.DatagramTransport):
        def get_extra_info(self, name: str, default: Any = None) -> Any:
            return default

    assert BatchedIntake.install(_Memory()) is None


async def test_the_http3_listener_reads_through_a_batched_intake() -> None:
    from eloquent_plugins.engine import EngineConfig, create_engine_app
    from eloquent_plugins.transports.config import StreamConfig
    from eloquent_plugins.transports.http3.server import start_http3_server

    srv = await start_http3_server(create_engine_app(EngineConfig(ttft=0.0, tpot=0.0)), host="127.0.0.1", port=0,
                                   config=StreamConfig())
    try:
        transport = srv._server._transport
        assert isinstance(transport.get_protocol(), BatchedIntake)
        assert transport.get_protocol().inner is srv._server
        from eloquent_client import EloquentClient

        body = {"model": "eloquent-builtin", "stream": True, "max_tokens": 8,
                "messages": [{"role": "user", "content": "hello"}]}
        async with EloquentClient(f"https://127.0.0.1:{srv.port}", transport="eloquent", verify=False,
                                  timeout=30) as client:
            async with client.stream("POST", "/v1/chat/completions", json=body) as s:
                text = await s.text()
        assert text and s.rendered[-1].data == "[DONE]"
    finally:
        await srv.close()
