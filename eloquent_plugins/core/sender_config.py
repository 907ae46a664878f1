"""The sender's settings and counters, a leaf below ``sender``, ``recovery`` and ``packetizer``.

The three halves of the sending machine all read ``SenderConfig`` and the packetizer counts into
``SenderStats``; kept apart from the state machine so the halves import this and never each other in a circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.pacing import check_tick
from eloquent_plugins.core.padding import PaddingPolicy


@dataclass(frozen=True, slots=True)
class SenderConfig:
    limits: Limits = field(default_factory=Limits)
    initial_rtt: float = 0.25
    max_ack_delay: float = 0.005
    """What the sender assumes the receiver may delay an ack by (the receiver default acks at once)."""
    max_probe_interval: float = 1.0
    """Cap on backed-off tail probes, so a stream resumes within this long after an outage ends."""
    keepalive: KeepAlivePolicy = field(default_factory=lambda: KeepAlivePolicy(interval=15.0))
    delta: bool = True
    """Encode each event as a prefix/suffix delta against the one before it."""
    carry_unacked: bool = True
    """The Eloquent rule: every packet carries the whole unacked run. False sends only new events (tail
    probes still resend the run): the packet-duplication baseline, driven by the same machine."""
    recarry_limit: int | None = None
    """Bytes of already-sent unacked events a flush for new events re-carries at most (None: all, the Eloquent
    rule). Past it, such a flush carries only the new events, and a loss is repaired as with ``carry_unacked``
    off (the run once an ack shows its carrier lost, or on a probe): under a long queue the run is mostly in
    flight, not lost, and re-carrying it is what a token stream costs a flow beside it (docs/results/redundancy.md)."""
    copies: int = 1
    """Send each datagram this many times (2 for the duplication baseline)."""
    redundancy: Literal["off", "adaptive"] | int = "off"
    """Copies of every run datagram, each under its own packet number: "off" (one), an int n (always n), or
    "adaptive": two while the loss estimate is at least ``redundancy_threshold``, one on a clean path. A copy
    repairs an independent loss at once instead of one token interval later."""
    redundancy_threshold: float = 0.01
    """Adaptive mode: the smoothed round-trip packet loss rate at or above which runs are sent twice."""
    loss_gain: float = 1 / 16
    """Weight of each packet in the loss estimate (``rtt.LossEstimator``): how fast it forgets."""
    cadence_probes: bool = False
    """While the loss estimate is at or above ``redundancy_threshold``, resend the run once no packet has left for
    1.5 mean push intervals, until a probe timeout after the newest event first left: the tail and generation
    gaps get a packet per token interval (as the simulator's oracle does) instead of waiting a PTO."""
    padding: PaddingPolicy | None = None
    """Pad every datagram to one of the policy's sizes (``core.padding.datagram_policy``; None or ``off``: none), so
    an observer does not learn each token's byte length from the datagram sizes (docs/SECURITY.md)."""
    send_tick: float = 0.0
    """Seconds (``--send-tick``; 0: off): every datagram leaves at a multiple of this tick on the caller's clock (the
    ``now`` it passes), so send times follow the clock, not the tokens (``core.pacing``). New events wait for the
    next multiple and go in one run; probes and keep-alives wait for the multiple at or after their deadline."""

    def __post_init__(self) -> None:
        if self.recarry_limit is not None and (isinstance(self.recarry_limit, bool) or self.recarry_limit < 0):
            raise ConfigError(f"recarry_limit must be None or >= 0 bytes, got {self.recarry_limit!r}")
        if self.copies < 1:
            raise ConfigError(f"copies must be >= 1, got {self.copies}")
        r = self.redundancy
        if isinstance(r, bool) or not (r in ("off", "adaptive") or (isinstance(r, int) and r >= 1)):
            raise ConfigError(f'redundancy must be "off", "adaptive" or an int >= 1, got {r!r}')
        if not 0 <= self.redundancy_threshold <= 1:
            raise ConfigError(f"redundancy_threshold must be in [0, 1], got {self.redundancy_threshold}")
        if not 0 < self.loss_gain <= 1:
            raise ConfigError(f"loss_gain must be in (0, 1], got {self.loss_gain}")
        check_tick(self.send_tick)
        pad = self.padding
        if pad is not None and pad.enabled:
            budget = self.limits.max_datagram_size
            if pad.mode == "constant" and not 128 <= pad.size <= budget:
                raise ConfigError(f"constant datagram padding needs 128 <= size <= {budget}, got {pad.size}")
            if pad.mode == "bucket" and pad.ceiling > budget:
                raise ConfigError(f"datagram padding classes go up to {pad.ceiling}, above the {budget} budget")


@dataclass(slots=True)
class SenderStats:
    data_packets: int = 0
    probe_packets: int = 0
    keepalive_packets: int = 0
    bytes_sent: int = 0
    acks_received: int = 0
    events_resent: int = 0
    redundant_packets: int = 0
    """Extra copies sent by ``SenderConfig.redundancy`` (also counted in ``data_packets``)."""
