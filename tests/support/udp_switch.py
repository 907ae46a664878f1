"""A loopback UDP forwarder with an off switch: ``blocked = True`` drops every datagram both ways (a UDP outage
or a network that blocks UDP), ``False`` lets them through again. Start it on a running loop."""

from __future__ import annotations

import asyncio
from typing import Any


class _Upstream(asyncio.DatagramProtocol):
    def __init__(self, switch: UdpSwitch, client: tuple[str, int]) -> None:
        self.switch, self.client = switch, client

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if not self.switch.blocked and self.switch.transport is not None:
            self.switch.transport.sendto(data, self.client)
        elif self.switch.blocked:
            self.switch.dropped += 1


class UdpSwitch(asyncio.DatagramProtocol):
    def __init__(self, target: tuple[str, int], blocked: bool = False) -> None:
        self.target = target
        self.blocked = blocked
        self.dropped = 0
        self.transport: asyncio.DatagramTransport | None = None
        self._upstreams: dict[tuple[str, int], asyncio.DatagramTransport] = {}

    @property
    def port(self) -> int:
        assert self.transport is not None
        return self.transport.get_extra_info("sockname")[1]

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        if self.blocked:
            self.dropped += 1
            return
        upstream = self._upstreams.get(addr)
        if upstream is not None:
            upstream.sendto(data)
            return
        asyncio.ensure_future(self._open(addr, data))

    async def _open(self, addr: tuple[str, int], first: bytes) -> None:
        if addr in self._upstreams:
            self._upstreams[addr].sendto(first)
            return
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            lambda: _Upstream(self, addr), remote_addr=self.target)
        self._upstreams[addr] = transport  # type: ignore[assignment]
        transport.sendto(first)  # type: ignore[attr-defined]

    def close(self) -> None:
        for upstream in self._upstreams.values():
            upstream.close()
        if self.transport is not None:
            self.transport.close()


async def start_switch(target: tuple[str, int], blocked: bool = False) -> UdpSwitch:
    _, protocol = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: UdpSwitch(target, blocked), local_addr=("127.0.0.1", 0))
    return protocol
