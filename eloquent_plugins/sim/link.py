"""Packets on a simulated path: header overhead, byte and packet counts, and delivery through a path model (``SlottedPath`` in the simulator)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from eloquent_plugins.sim.netem import SlottedPath
from eloquent_plugins.sim.clock import EventLoop

TCP_HEADER = 40
"""IPv4 (20) + TCP (20) bytes per segment or ACK, no options (a SACK option is added where one is sent)."""
QUIC_DATAGRAM_HEADER = 28 + 25
"""IPv4 (20) + UDP (8), then a QUIC short header (1 + 8-byte connection id + 2-byte packet number), the
DATAGRAM frame type and length (2) and the AEAD tag (16): about 25 more, ACK frames piggybacked."""


@dataclass(slots=True)
class WireStats:
    packets: int = 0
    bytes: int = 0


class SimWire:
    """One direction of one scheme's connection: every packet is counted, then the path decides its fate."""

    __slots__ = ("loop", "path", "header", "deliver", "stats")

    def __init__(self, loop: EventLoop, path: SlottedPath, header: int, deliver: Callable[[Any], None]) -> None:
        self.loop = loop
        self.path = path
        self.header = header
        self.deliver = deliver
        self.stats = WireStats()

    def send(self, packet: Any, payload_bytes: int, extra_header: int = 0) -> None:
        size = self.header + extra_header + payload_bytes
        self.stats.packets += 1
        self.stats.bytes += size
        arrival = self.path.transmit(self.loop.now, size)
        if arrival is not None:
            self.loop.at(arrival, self.deliver, packet)
