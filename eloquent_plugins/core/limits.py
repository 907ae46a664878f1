"""Bounds on everything a peer controls. Exceeding one raises ``LimitExceeded`` with the limit's name."""

from __future__ import annotations

from dataclasses import dataclass

from eloquent_plugins.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Limits:
    max_datagram_size: int = 1200
    """Datagram payload budget: a packet never exceeds it (QUIC's safe minimum path MTU leaves ~1200 bytes)."""
    max_event_bytes: int = 1 << 20
    """Largest single event; bigger events are fragmented on the wire and refused above this."""
    max_entries_per_packet: int = 4096
    max_index_gap: int = 4096
    """How far past the next expected index a receiver buffers events (split runs arrive out of order)."""
    max_buffered_bytes: int = 8 << 20
    """Out-of-order and reference payloads a receiver keeps for one stream."""
    max_streams: int = 256
    """Concurrent Eloquent streams per connection (enforced by transports)."""
    max_run_datagrams: int = 16
    """Datagrams one flush may emit for one stream; the oldest events go first, the rest wait for acks."""
    max_stream_id: int = (1 << 62) - 1

    def __post_init__(self) -> None:
        if self.max_datagram_size < 64:
            raise ConfigError(f"max_datagram_size must be at least 64 bytes, got {self.max_datagram_size}")
        for name in ("max_event_bytes", "max_entries_per_packet", "max_index_gap", "max_buffered_bytes",
                     "max_streams", "max_run_datagrams"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
