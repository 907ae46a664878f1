"""What the UDP relay can add for measurements: a per-packet record of each client's two directions (so an
end-to-end run's actual drop pattern can be replayed in the simulator) and a shared bottleneck (a rate and a
drop-tail queue that every client's server->client packets cross, so loss can come from queue overflow and one
flow's extra packets cost the others).
"""

from __future__ import annotations

from dataclasses import dataclass

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.core.errors import ConfigError


@dataclass(slots=True)
class PacketRecord:
    """One datagram through the relay; times are seconds since the relay started."""

    received: float
    """When the relay read it."""
    size: int
    due: float | None
    """When the path model released it; None: dropped."""
    cause: str = ""
    """Why it was dropped: "loss" (the loss model or a trace), "outage" or "queue" (the bottleneck was full)."""
    sent: float | None = None
    """When the relay actually wrote it out (``due`` plus the event loop's timer lateness)."""

    @property
    def dropped(self) -> bool:
        return self.due is None


@dataclass(frozen=True, slots=True)
class Bottleneck:
    """A shared link: ``rate`` bits per second with a drop-tail queue of ``queue`` bytes (IP+UDP included)."""

    rate: float
    queue: int = 64 * 1024

    def __post_init__(self) -> None:
        require_finite("bottleneck rate (bits/s)", self.rate, strict=True)
        if self.queue < 1:
            raise ConfigError("bottleneck queue must be >= 1 byte")


class SharedQueue:
    """The bottleneck's state: when the link is next free. A packet that would find more than ``queue`` bytes
    waiting ahead of it is dropped (queue overflow); otherwise it leaves after the ones ahead of it."""

    __slots__ = ("config", "_free", "drops", "packets")

    def __init__(self, config: Bottleneck) -> None:
        self.config = config
        self._free = 0.0
        self.drops = 0
        self.packets = 0

    def depart(self, now: float, size: int) -> float | None:
        self.packets += 1
        backlog = max(0.0, self._free - now) * self.config.rate / 8
        if backlog + size > self.config.queue:
            self.drops += 1
            return None
        self._free = max(now, self._free) + size * 8 / self.config.rate
        return self._free


def fate_trace_text(records: list[PacketRecord], start: float = 0.0, end: float | None = None,
                    delay_ms: str = "-", tail: float = 0.05) -> str:
    """The drop pattern of ``records`` in [start, end) as a trace (``sim.netem.trace`` format, loss 0 or 1) with
    ``start`` as time 0: a packet sent at t meets the fate of the recorded packet nearest in time (boundaries at
    the midpoints), so a replay whose packets leave a little earlier or later still meets the same drops; from
``tail`` seconds after the last recorded packet, nothing is dropped."""
    chosen = [r for r in records if r.received >= start and (end is None or r.received < end)]
    lines = ["# time_ms loss delay_ms (replayed from a relay record)"]
    previous: float | None = None
    last_fate: int | None = None
    for r in chosen:
        t = r.received - start
        boundary = 0.0 if previous is None else (previous + t) / 2
        fate = 1 if r.dropped else 0
        if fate != last_fate:
            if lines[-1].startswith(f"{boundary * 1000:.3f} "):
                lines.pop()  # two changes at one instant: keep the later
            lines.append(f"{boundary * 1000:.3f} {fate} {delay_ms}")
            last_fate = fate
        previous = t
    if len(lines) == 1:
        lines.append(f"0 0 {delay_ms}")
    elif previous is not None and last_fate:
        # Past the record the path is clean (what a replay sends after the real stream ended meets no loss).
        lines.append(f"{(previous + tail) * 1000:.3f} 0 {delay_ms}")
    return "\n".join(lines) + "\n"
