"""One direction of a network path: outages, Gilbert-Elliott loss (with an optional loss schedule), a trace,
a bandwidth bottleneck, one-way delay and jitter. Sans-I/O: ``transmit(now, size)`` answers when the packet
arrives, or None if it is lost. The simulator and the relay drive this same class.

Every packet draws from the loss, trace and jitter generators whether or not an earlier stage already dropped
it, so the n-th packet meets the same fate in every run with the same seed, whatever the scheme around it does
with the packets before (common random numbers: schemes are compared on the same path sample).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.sim.netem.capacity import CapacityLink, TraceQueue
from eloquent_plugins.sim.netem.gilbert import GilbertElliott, LossProcess
from eloquent_plugins.sim.netem.schedule import LossSchedule, Outage
from eloquent_plugins.sim.netem.trace import Trace


@dataclass(frozen=True, slots=True)
class PathConfig:
    delay: float = 0.0
    """Base one-way delay in seconds: the path's minimum (jitter only adds)."""
    jitter: float = 0.0
    """Mean extra delay in seconds, uniform in [0, 2 * jitter] per packet."""
    loss: float = 0.0
    burst: float = 1.0
    bandwidth: float | None = None
    """Bottleneck in bits per second (a FIFO serialiser before the delay); None: unlimited."""
    trace: Trace | None = None
    loss_schedule: LossSchedule | None = None
    outages: tuple[Outage, ...] = ()
    slot: float | None = None
    """Burst clock for silences: the loss chain steps once per packet, and once per ``slot`` seconds of silence
    between packets, so a loss burst lasts about ``burst`` packets of a stream paced every ``slot`` and does not
    freeze while a sender is quiet (a backed-off TCP would otherwise meet the same burst minutes later).
    None: steps only per packet, like netem's Gilbert-Elliott."""
    capacity: CapacityLink | None = None
    """A trace-driven bottleneck queue (``netem.capacity``) before the delay; losses then come from its
    overflow. The relay shares one queue per direction among all its clients (``PathConfig.without_capacity``
    for their own models); the simulator shares one between a scheme's flow and its cross traffic."""
    reorder: bool = False
    """False (default): packets leave in the order they entered (jitter delays the ones behind, like a queue);
    True: each packet takes its own delay, so jitter can reorder them."""

    def __post_init__(self) -> None:
        require_finite("delay (seconds)", self.delay)
        require_finite("jitter (seconds)", self.jitter)
        if self.slot is not None:
            require_finite("slot (seconds)", self.slot, strict=True)
        if self.bandwidth is not None:
            require_finite("bandwidth (bits/s)", self.bandwidth, strict=True)
        GilbertElliott(self.loss, self.burst)  # validates the pair
        if self.loss_schedule is not None:
            for _, loss in self.loss_schedule.points:
                GilbertElliott(loss, self.burst)

    def without_capacity(self) -> PathConfig:
        return replace(self, capacity=None)

    def config_loss(self, now: float) -> float:
        return self.loss if self.loss_schedule is None else self.loss_schedule.at(now, self.loss)

    def in_outage(self, now: float) -> bool:
        return any(o.covers(now) for o in self.outages)

    @property
    def min_delay(self) -> float:
        """The smallest one-way delay a packet can see: the stall metric's reference."""
        if self.trace is not None and self.trace.min_delay is not None:
            return min(self.delay, self.trace.min_delay)
        return self.delay


@dataclass(slots=True)
class PathStats:
    packets: int = 0
    bytes: int = 0
    lost: int = 0
    outage_drops: int = 0
    queue_drops: int = 0


class Link:
    """What happens after the loss decision: a FIFO bottleneck, then delay plus jitter, in order unless
    ``reorder``. Shared by ``PathModel`` and ``SlottedPath`` (through ``deliver``)."""

    __slots__ = ("config", "queue", "_link_free", "_last_arrival")

    def __init__(self, config: PathConfig) -> None:
        self.config = config
        self.queue = TraceQueue(config.capacity, record_tail=1 << 20) if config.capacity is not None else None
        """The trace-driven queue, shared with any cross traffic through ``through``."""
        self._link_free = 0.0
        self._last_arrival = 0.0

    def depart(self, now: float, size: int) -> float | None:
        """Serialise through the bottleneck (lost packets use it too: they die after it); None: the trace queue
        dropped it."""
        if self.queue is not None:
            departure = self.queue.offer(now, size)
            if departure is None or self.config.bandwidth is None:
                return departure
            now = departure
        if self.config.bandwidth is None:
            return now
        departure = max(now, self._link_free) + size * 8 / self.config.bandwidth
        self._link_free = departure
        return departure

    def through(self, now: float, size: int) -> float | None:
        """Another flow's packet on this link (cross traffic): the queue and the delay, no loss draws, no
        jitter, so the scheme's own packets keep their random draws."""
        departure = self.depart(now, size)
        return None if departure is None else self.arrive(departure, self.config.delay, 0.0)

    def arrive(self, departure: float, delay: float, extra: float) -> float:
        arrival = departure + delay + extra
        if not self.config.reorder:
            arrival = max(arrival, self._last_arrival)
            self._last_arrival = arrival
        return arrival


def deliver(config: PathConfig, link: Link, stats: PathStats, now: float, size: int, *, lost: bool,
            trace_u: float, jitter_u: float) -> float | None:
    """The drop/delay decision both path models share, once a packet's random draws are made: ``lost`` from the
    loss chain, ``trace_u`` (against the trace's loss) and ``jitter_u`` uniform in [0, 1). Counts the packet in
    ``stats``; returns its arrival time, or None if an outage, the chain or the trace drops it."""
    stats.packets += 1
    stats.bytes += size
    delay = config.delay
    if config.trace is not None:
        record = config.trace.at(now)
        lost = lost or trace_u < record.loss
        if record.delay is not None:
            delay = record.delay
    departure = link.depart(now, size)
    if departure is None:
        stats.queue_drops += 1
        return None
    if config.in_outage(now):
        stats.outage_drops += 1
        return None
    if lost:
        stats.lost += 1
        return None
    return link.arrive(departure, delay, jitter_u * 2 * config.jitter)


class PathModel:
    """Stateful walk of one direction. ``now`` is seconds since the path started (the schedules' clock)."""

    def __init__(self, config: PathConfig, seed: int) -> None:
        self.config = config
        self.stats = PathStats()
        base = random.Random(seed)
        self._loss_rng = random.Random(base.getrandbits(64))
        self._trace_rng = random.Random(base.getrandbits(64))
        self._jitter_rng = random.Random(base.getrandbits(64))
        self._loss = LossProcess(GilbertElliott(config.loss, config.burst), self._loss_rng)
        self._link = Link(config)
        self._last_send: float | None = None

    @property
    def link(self) -> Link:
        return self._link

    def transmit(self, now: float, size: int) -> float | None:
        """Offer a ``size``-byte packet at ``now``; return its arrival time, or None if the path drops it."""
        cfg = self.config
        loss = cfg.config_loss(now)
        if loss != self._loss.model.loss:
            self._loss.model = GilbertElliott(loss, cfg.burst)
        steps = 1
        if cfg.slot is not None and self._last_send is not None:
            steps = max(1, int((now - self._last_send) / cfg.slot + 0.5))
        self._last_send = now
        lost = self._loss.lost(steps)
        trace_u = self._trace_rng.random() if cfg.trace is not None else 1.0
        jitter_u = self._jitter_rng.random() if cfg.jitter > 0 else 0.0
        return deliver(cfg, self._link, self.stats, now, size, lost=lost, trace_u=trace_u, jitter_u=jitter_u)
