"""Path estimates from acks: round-trip time (RFC 9002 section 5), used to time tail probes, and the loss rate
that drives adaptive redundancy."""

from __future__ import annotations

from dataclasses import dataclass, field

from eloquent_plugins.core.errors import ConfigError, InvalidArgument

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


@dataclass(slots=True)
class LossEstimator:
    """Smoothed per-packet loss rate of the round trip, from the packet numbers acks report (adaptive redundancy).

    An ack whose largest packet number jumps from A to L over data packets A < n < L that no ack reported counts
    those as lost and L as delivered: with the receiver acking every data packet (its default), a packet goes
    unreported only when it or its ack was lost, and either means the path is dropping packets now. Each packet
    is one sample folded into an EWMA of weight ``gain``, so the estimate decays by ``1 - gain`` per delivered
    packet: a clean path turns redundancy off again within a few dozen packets.
    """

    gain: float = 1 / 16
    rate: float = field(init=False, default=0.0)
    delivered: int = field(init=False, default=0)
    lost: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not 0 < self.gain <= 1:
            raise ConfigError(f"gain must be in (0, 1], got {self.gain}")

    def on_ack(self, lost: int) -> None:
        """One newly reported packet, after ``lost`` data packets that no ack reported."""
        if lost < 0:
            raise InvalidArgument(f"lost must be >= 0, got {lost}")
        keep = 1 - self.gain
        # ``lost`` samples of 1 then one of 0, in closed form: rate' = keep^(n+1) rate + keep (1 - keep^n).
        self.rate = keep ** (lost + 1) * self.rate + keep * (1 - keep ** lost)
        self.lost += lost
        self.delivered += 1
