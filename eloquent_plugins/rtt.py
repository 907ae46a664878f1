"""Round-trip time estimate (RFC 9002 section 5), used to time tail probes."""

from __future__ import annotations

from dataclasses import dataclass, field

GRANULARITY = 0.001


@dataclass(slots=True)
class RttEstimator:
    initial_rtt: float = 0.25
    smoothed: float = field(init=False)
    variance: float = field(init=False)
    minimum: float = field(init=False, default=float("inf"))
    latest: float = field(init=False, default=0.0)
    samples: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.smoothed = self.initial_rtt
        self.variance = self.initial_rtt / 2

    def update(self, sample: float, ack_delay: float = 0.0) -> None:
        """Fold in one sample; the peer's reported ack delay is removed when that keeps it above min RTT."""
        if sample <= 0:
            return
        self.latest = sample
        self.minimum = min(self.minimum, sample)
        adjusted = sample - ack_delay if sample - ack_delay >= self.minimum else sample
        if self.samples == 0:
            self.smoothed = adjusted
            self.variance = adjusted / 2
        else:
            self.variance = 0.75 * self.variance + 0.25 * abs(self.smoothed - adjusted)
            self.smoothed = 0.875 * self.smoothed + 0.125 * adjusted
        self.samples += 1

    def probe_timeout(self, max_ack_delay: float) -> float:
        """QUIC's PTO: how long an unanswered packet waits before the sender probes."""
        return self.smoothed + max(4 * self.variance, GRANULARITY) + max_ack_delay
