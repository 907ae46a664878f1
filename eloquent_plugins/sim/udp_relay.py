"""A user-space UDP relay on loopback that applies the netem path models to real datagrams, each direction
with its own settings: what the kernel here cannot do (no ``tc netem``), for end-to-end tests over real QUIC.

Each client address gets its own upstream socket (so the server sees one peer per client and each QUIC connection
stays separate) and its own pair of seeded ``PathModel`` instances, the same class the simulator's paths build on.
Times in outages and loss schedules are seconds since the relay started.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.sim.netem import Outage, PathConfig, PathModel, TraceQueue
from eloquent_plugins.sim.precise_timers import PreciseTimers
from eloquent_plugins.sim.relay_record import Bottleneck, PacketRecord, SharedQueue

TAIL_RECORD = 300_000
"""Entries of a trace queue's tail record (``TraceQueue.floor``): minutes of a saturated LTE link, ~25 MB."""
UDP_IP_HEADER = 28
"""IPv4 + UDP bytes, counted against a bandwidth limit on top of the datagram itself."""


@dataclass(frozen=True, slots=True)
class RelayConfig:
    target: tuple[str, int]
    """Where datagrams from clients go (the server)."""
    listen: tuple[str, int] = ("127.0.0.1", 0)
    """Where clients send; port 0 picks a free one (see ``Relay.listen_addr``)."""
    upstream: PathConfig = field(default_factory=PathConfig)
    """Client -> server direction."""
    downstream: PathConfig = field(default_factory=PathConfig)
    """Server -> client direction."""
    outages: tuple[Outage, ...] = ()
    """Windows in which everything is dropped both ways."""
    seed: int = 0
    max_clients: int = 1024
    record: bool = False
    """Keep a ``PacketRecord`` of every datagram, per client and direction (``Relay.records``)."""
    bottleneck: Bottleneck | None = None
    """A rate and queue shared by every client's server -> client packets, before their own path model."""
    precise_timers: bool = False
    """Also release packets from a timer thread (``sim.precise_timers``), on time to tens of microseconds instead
    of up to 1 ms late (epoll's millisecond timeout). On for the benchmarks' harness; off by default, since on a
    CPU-starved machine the extra thread's GIL hand-overs cost more than they save."""

    def __post_init__(self) -> None:
        if self.max_clients < 1:
            raise ConfigError("max_clients must be >= 1")

    def direction(self, upstream: bool) -> PathConfig:
        base = self.upstream if upstream else self.downstream
        return dataclasses.replace(base, outages=base.outages + self.outages) if self.outages else base


@dataclass(slots=True)
class DirectionStats:
    received: int = 0
    forwarded: int = 0
    dropped: int = 0
    """Lost to the loss model or a trace."""
    outage_dropped: int = 0
    queue_dropped: int = 0
    """Lost to the shared bottleneck's full queue."""
    bytes_forwarded: int = 0


@dataclass(slots=True)
class RelayStats:
    upstream: DirectionStats = field(default_factory=DirectionStats)
    downstream: DirectionStats = field(default_factory=DirectionStats)
    clients: int = 0
    refused_clients: int = 0
    upstream_errors: int = 0
    """Clients whose upstream socket could not be opened."""


def parse_hostport(text: str, what: str = "address") -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT``."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{what} must be HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


class _Upstream(asyncio.DatagramProtocol):
    def __init__(self, client: _Client) -> None:
        self.client = client

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.client.from_server(data)


class _Pipe:
    """One direction's packets in flight, released at their arrival times. The loop's timer heap does not keep
    equal deadlines in order, so a FIFO path keeps its own queue and one timer for its head."""

    def __init__(self, loop: asyncio.AbstractEventLoop, fifo: bool, stats: DirectionStats,
                 send: Callable[[bytes], None], origin: float = 0.0, timers: Any = None) -> None:
        self._loop = loop
        self._timers = timers if timers is not None else loop
        """Anything with the loop's ``call_at``: the loop itself or a ``PreciseTimers``."""
        self._origin = origin
        self._fifo = fifo
        self._stats = stats
        self._send = send
        self._queue: deque[tuple[float, bytes, PacketRecord | None]] = deque()
        self._timer: Any = None
        self._loose: set[Any] = set()
        self.closed = False

    def put(self, due: float, data: bytes, record: PacketRecord | None = None) -> None:
        if not self._fifo:
            handle = self._timers.call_at(due, self._release_one, data, record)
            self._loose.add(handle)
            return
        self._queue.append((due, data, record))
        if self._timer is None:
            self._timer = self._timers.call_at(due, self._release)

    def _deliver(self, data: bytes, record: PacketRecord | None) -> None:
        if self.closed:
            return
        if record is not None:
            record.sent = self._loop.time() - self._origin
        self._stats.forwarded += 1
        self._stats.bytes_forwarded += len(data)
        self._send(data)

    def _release_one(self, data: bytes, record: PacketRecord | None) -> None:
        self._loose = {h for h in self._loose if not h.cancelled() and h.when() > self._loop.time()}
        self._deliver(data, record)

    def _release(self) -> None:
        self._timer = None
        now = self._loop.time()
        while self._queue and self._queue[0][0] <= now:
            _, data, record = self._queue.popleft()
            self._deliver(data, record)
        if self._queue and not self.closed:
            self._timer = self._timers.call_at(self._queue[0][0], self._release)

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        for handle in self._loose:
            handle.cancel()
        self._queue.clear()


class _Client:
    """One client address: its upstream socket and one path model per direction."""

    def __init__(self, relay: Relay, addr: tuple[str, int], index: int) -> None:
        self.relay = relay
        self.addr = addr
        self.index = index
        seeds = random.Random(f"eloquent-relay/{relay.config.seed}/{index}")
        # A trace-driven queue is the relay's, shared by every client (``Relay.queues``), not each client's own.
        self.up = PathModel(relay.config.direction(True).without_capacity(), seeds.getrandbits(63))
        self.down = PathModel(relay.config.direction(False).without_capacity(), seeds.getrandbits(63))
        self.own = {"up": DirectionStats(), "down": DirectionStats()}
        """This client's own counts (received, queue_dropped): what the shared queue did to its flow."""
        self.transport: asyncio.DatagramTransport | None = None
        self.pending: list[bytes] = []
        self.severed = False
        """Its path is gone for good (``Relay.sever``): every datagram either way is dropped."""
        loop = asyncio.get_running_loop()
        self.up_pipe = _Pipe(loop, not self.up.config.reorder, relay.stats.upstream, self._to_server,
                             relay._start, relay.timers)
        self.down_pipe = _Pipe(loop, not self.down.config.reorder, relay.stats.downstream, self._to_client,
                               relay._start, relay.timers)
        self.ready = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            transport, _ = await loop.create_datagram_endpoint(lambda: _Upstream(self),
                                                               remote_addr=self.relay.config.target)
        except OSError:
            self.relay.stats.upstream_errors += 1  # unreachable target: this client's datagrams go nowhere
            self.pending.clear()
            return
        if self.relay.closed:
            transport.close()
            return
        self.transport = transport  # type: ignore[assignment]
        for data in self.pending:
            transport.sendto(data)
        self.pending.clear()

    def from_client(self, data: bytes) -> None:
        if self.severed:
            self.relay._severed(self.relay.stats.upstream)
            return
        self.relay._pass(self.up, self.relay.stats.upstream, data, self.up_pipe, (self.index, "up"),
                         trace_queue=self.relay.queues.get("up"), own=self.own["up"])

    def from_server(self, data: bytes) -> None:
        if self.severed:
            self.relay._severed(self.relay.stats.downstream)
            return
        self.relay._pass(self.down, self.relay.stats.downstream, data, self.down_pipe, (self.index, "down"),
                         self.relay.bottleneck, trace_queue=self.relay.queues.get("down"), own=self.own["down"])

    def _to_server(self, data: bytes) -> None:
        if self.transport is None:
            if not self.ready.done():
                self.pending.append(data)
        else:
            self.transport.sendto(data)

    def _to_client(self, data: bytes) -> None:
        if self.relay.transport is not None:
            self.relay.transport.sendto(data, self.addr)

    def close(self) -> None:
        self.up_pipe.close()
        self.down_pipe.close()
        self.ready.cancel()
        if self.transport is not None:
            self.transport.close()


class Relay(asyncio.DatagramProtocol):
    """Running relay; build it with ``start_relay``."""

    def __init__(self, config: RelayConfig) -> None:
        self.config = config
        self.stats = RelayStats()
        self.transport: asyncio.DatagramTransport | None = None
        self.closed = False
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()
        self.timers: Any = PreciseTimers(self._loop) if config.precise_timers else None
        self._clients: dict[tuple[str, int], _Client] = {}
        self.records: dict[tuple[int, str], list[PacketRecord]] = {}
        """With ``config.record``: (client index, "up" or "down") -> every datagram, in arrival order."""
        self.bottleneck = SharedQueue(config.bottleneck) if config.bottleneck is not None else None
        self.queues: dict[str, TraceQueue] = {
            name: TraceQueue(path.capacity, record_tail=TAIL_RECORD) for name, path in (("up", config.upstream), ("down", config.downstream))
            if path.capacity is not None}
        """The trace-driven bottleneck of each direction ("up": to the server), shared by every client."""
        self.trace_from = 0.0
        """Relay seconds before which packets skip ``queues``: a bench's handshakes stay off the stretch of trace
        under test (``math.inf`` while they run), as the simulator's connections exist already."""

    def client_stats(self, index: int) -> dict[str, DirectionStats]:
        """One client's own counts per direction (received, queue_dropped), by order of first contact."""
        for client in self._clients.values():
            if client.index == index:
                return client.own
        return {"up": DirectionStats(), "down": DirectionStats()}

    @property
    def listen_addr(self) -> tuple[str, int]:
        assert self.transport is not None
        return self.transport.get_extra_info("sockname")[:2]

    def upstream_addr(self, client: tuple[str, int]) -> tuple[str, int] | None:
        """The local address of the socket that relays ``client``'s datagrams (what the server sees)."""
        entry = self._clients.get(client)
        if entry is None or entry.transport is None:
            return None
        return entry.transport.get_extra_info("sockname")[:2]

    @property
    def origin(self) -> float:
        """The loop time the relay started at: time 0 of its schedules and records."""
        return self._start

    def elapsed(self) -> float:
        return self._loop.time() - self._start

    def cut(self, duration: float) -> None:
        """Drop everything both ways from now for ``duration`` seconds, for every client now and later.

        Tests call it once a stream is under way, so an outage lands mid-stream however slow the machine is,
        instead of at a time fixed before the handshake."""
        outage = Outage(self.elapsed(), duration)
        self.config = dataclasses.replace(self.config, outages=self.config.outages + (outage,))
        for client in self._clients.values():
            for model in (client.up, client.down):
                model.config = dataclasses.replace(model.config, outages=model.config.outages + (outage,))

    def sever(self) -> None:
        """The path of every client seen so far dies for good, both ways, what is in flight included; clients that
        come later (a new socket, a new QUIC connection) pass as before.

        An outage that ends by itself may end before a busy client looked at its path, which then finds it alive
        and never notices the cut; a severed path stays dead, so a cut that lands is always noticed, while a new
        connection gets through at once (a NAT rebinding, a dead access network beside a live one)."""
        for client in self._clients.values():
            client.severed = True
            client.up_pipe.close()
            client.down_pipe.close()

    def _severed(self, stats: DirectionStats) -> None:
        stats.received += 1
        stats.outage_dropped += 1

    def client_index(self, upstream: tuple[str, int]) -> int | None:
        """Which client (in order of first contact) the server sees at ``upstream`` (its relayed address)."""
        for client in self._clients.values():
            if client.transport is not None and tuple(client.transport.get_extra_info("sockname")[:2]) == upstream:
                return client.index
        return None

    def record_of(self, client: int, direction: str) -> list[PacketRecord]:
        """The recorded datagrams of one client and direction ("up": to the server), times since the start."""
        return self.records.get((client, direction), [])

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        client = self._clients.get(addr)
        if client is None:
            if len(self._clients) >= self.config.max_clients:
                self.stats.refused_clients += 1
                return
            client = self._clients[addr] = _Client(self, addr, len(self._clients))
            self.stats.clients += 1
        client.from_client(data)

    def _pass(self, model: PathModel, stats: DirectionStats, data: bytes, pipe: _Pipe, key: tuple[int, str],
              queue: SharedQueue | None = None, *, trace_queue: TraceQueue | None = None,
              own: DirectionStats | None = None) -> None:
        stats.received += 1
        if own is not None:
            own.received += 1
        now = self.elapsed()
        size = len(data) + UDP_IP_HEADER
        record = None
        if self.config.record:
            record = PacketRecord(now, size, None)
            self.records.setdefault(key, []).append(record)
        departure: float | None = now if queue is None else queue.depart(now, size)
        if departure is not None and trace_queue is not None and now >= self.trace_from:
            departure = trace_queue.offer(departure, size)
        if departure is None:
            stats.queue_dropped += 1
            if own is not None:
                own.queue_dropped += 1
            if record is not None:
                record.cause = "queue"
            return
        outage_before = model.stats.outage_drops
        arrival = model.transmit(departure, size)
        if arrival is None:
            if model.stats.outage_drops > outage_before:
                stats.outage_dropped += 1
            else:
                stats.dropped += 1
            if record is not None:
                record.cause = "outage" if model.stats.outage_drops > outage_before else "loss"
            return
        if record is not None:
            record.due = arrival
        if own is not None:
            own.forwarded += 1
            own.bytes_forwarded += len(data)
        pipe.put(self._start + arrival, data, record)

    async def close(self) -> None:
        """Stop relaying: drop what is still in flight and close every socket."""
        if self.closed:
            return
        self.closed = True
        for client in self._clients.values():
            client.close()
        if self.timers is not None:
            self.timers.close()
        if self.transport is not None:
            self.transport.close()
        await asyncio.sleep(0)

    async def __aenter__(self) -> Relay:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


async def start_relay(config: RelayConfig) -> Relay:
    """Bind the listening socket and return the running relay (``.listen_addr``, ``.stats``, ``close()``)."""
    loop = asyncio.get_running_loop()
    relay = Relay(config)
    try:
        transport, _ = await loop.create_datagram_endpoint(lambda: relay, local_addr=config.listen)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {config.listen[0]}:{config.listen[1]}: {exc}") from None
    relay.transport = transport  # type: ignore[assignment]
    return relay
