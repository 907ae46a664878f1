"""Where an end-to-end token's lateness on a trace comes from: this machine's processing or the link (issue 30).

The simulator sends each token's packet into the bottleneck at the instant it is generated and renders it the
instant its packet arrives; end to end the packet reaches the relay's queue after the server's work and the
relay's read (``pre``), and renders after the relay's timer and the client's work (``post``). On a cellular trace
the ``pre`` part is amplified: the opportunities come in bursts, so a packet half a millisecond late can miss a
burst and wait tens of milliseconds for the next, which the simulator's packet never does.

From the relay's record of one client's server -> client packets, per token (times since the relay started):

- ``ready_g``: the link's floor at generation (``TraceQueue.floor``), the table's reference;
- ``ready_a``: the floor at ``a``, when the relay read the first packet from the server at or after generation
  (whatever it carried: a scheme that holds data back is not excused), but never later than generation plus
  ``p``, this machine's processing (``processing``: 5 ms, or the stream's median wait for the tokens QUIC's
  window did not hold if that is longer): when the window is full or aioquic's pacer holds its queue, nothing at
  all leaves the server and the first packet after generation comes late for a reason the simulator has too,
  the scheme's time, not processing;
- ``due``: when the path model released the packet that delivered the token: the client logs when it starts
  on each UDP datagram (``ClientArrivals``); a token renders while the client works on one datagram, so the
  last datagram it started on before the render is the one, and the client's n-th datagram is the n-th packet
  the relay wrote to it (loopback keeps order and loses nothing). Without that log: the last packet the relay
  wrote to the client at or before the render (never earlier than the true one: an upper bound).

``pre = ready_a - ready_g``, ``net = due - one_way - ready_a``, ``post = render - due``; the table's lateness is
``pre + net + post + one_way - d``. For the datagram schemes the front end's log adds ``held`` (inside ``pre`` and
``net``: other packets, such as QUIC's ACKs, may leave meanwhile): how long the token waited in the front end
before its first datagram went to QUIC, which is aioquic's congestion window holding it (the simulator's Eloquent
has no window and sends at once). The **network-only stall** is ``stall_metrics(ready_a, due, one_way)``: the
project's stall ratio (``core.stall``, unchanged) on the times the network alone produced, from where this
machine put the packet into the bottleneck. In the simulator, with no processing, it is the table's stall.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from eloquent_plugins.core.stall import stall_metrics
from eloquent_plugins.sim.netem import TraceQueue
from eloquent_plugins.sim.relay_record import PacketRecord

TERMS = ("pre", "net", "post", "held")


@dataclass(frozen=True, slots=True)
class TokenTimes:
    """One stream's per-token reference and network times (relay seconds), from ``token_times``."""

    ready_g: tuple[float, ...]
    ready_a: tuple[float, ...]
    due: tuple[float, ...]
    rendered: tuple[float, ...]
    held: tuple[float, ...] = ()
    """Datagram schemes: per token, its first datagram's send (front end's log) minus its generation."""

    def terms(self, one_way: float) -> dict[str, list[float]]:
        return {"pre": [a - g for g, a in zip(self.ready_g, self.ready_a)],
                "net": [max(0.0, u - one_way - a) for a, u in zip(self.ready_a, self.due)],
                "post": [r - u for u, r in zip(self.due, self.rendered)], "held": list(self.held)}

    def only(self, keep: Sequence[bool]) -> TokenTimes:
        """The tokens ``keep`` marks (the text-carrying events: the simulator's tokens, without the role, finish
        and ``[DONE]`` chunks, which an end-to-end stream renders as events too)."""

        def pick(values: tuple[float, ...]) -> tuple[float, ...]:
            return tuple(v for v, k in zip(values, keep) if k) if values else values

        return TokenTimes(pick(self.ready_g), pick(self.ready_a), pick(self.due), pick(self.rendered),
                          pick(self.held))

    def network_stall(self, one_way: float) -> float:
        return stall_metrics(self.ready_a, self.due, one_way).stall_ratio


@dataclass(slots=True)
class ClientArrivals:
    """When a client connection started on each UDP datagram from the server (loop clock), from its
    ``first``-th datagram on (the ones before, the handshake, were not logged)."""

    first: int
    times: list[float]


def log_arrivals(connection: Any) -> ClientArrivals:
    """Start logging an ``eloquent_client`` HTTP/3 connection's datagram arrivals: the bench wraps its
    protocol's ``datagram_received`` (what the event loop calls per datagram) on this one instance."""
    protocol = connection._protocol
    log = ClientArrivals(protocol.received, [])
    inner = protocol.datagram_received
    clock = protocol.loop.time

    def datagram_received(data: bytes, addr: Any) -> None:
        log.times.append(clock())
        inner(data, addr)

    protocol.datagram_received = datagram_received
    return log


HELD = 0.001
"""A token QUIC's window held longer than this (``held``) waited for the window, not for this machine."""
PROCESSING_CEILING = 0.005
"""This machine's processing from a token's generation to the relay's read is about a millisecond; a longer wait
for the first packet from the server is the scheme's (a full window, the pacer), unless the stream's typical
processing is longer still (a loaded machine)."""


def processing(generated: Sequence[float], reads: Sequence[float], held: Sequence[float] = ()) -> float:
    """How long this machine's processing before the bottleneck may take in one stream: ``PROCESSING_CEILING``,
    or the median ``read - generated`` of the tokens QUIC's window did not hold (``held``) if that is longer."""
    delays = sorted(a - g for k, (g, a) in enumerate(zip(generated, reads)) if k >= len(held) or held[k] <= HELD)
    return max(PROCESSING_CEILING, delays[len(delays) // 2] if delays else 0.0)


def token_times(queue: TraceQueue, generated: Sequence[float], rendered: Sequence[float],
                down: Sequence[PacketRecord], origin: float, client: ClientArrivals | None = None,
                held: Sequence[float] = ()) -> TokenTimes:
    """``generated``/``rendered``: the stream's times on the loop clock; ``down``: the relay's record of its
    client's server -> client packets (relay seconds); ``origin``: the relay's start on the loop clock;
    ``client``: the client connection's datagram arrivals (exact delivering packets); ``held``: per token, how
    long QUIC's window held it in the front end (``held_times``; datagram schemes)."""
    keys = [a for a, _ in queue.tail]
    arrivals = [p.received for p in down]
    released = sorted((p.sent, p.due) for p in down if p.sent is not None and p.due is not None)
    out_times = [s for s, _ in released]
    client_times = [t - origin for t in client.times] if client is not None else []
    gens = [g_abs - origin for g_abs in generated]
    reads = []
    for g in gens:
        i = bisect.bisect_left(arrivals, g)
        reads.append(arrivals[i] if i < len(arrivals) else g)
    p = processing(gens, reads, held)
    ready_g, ready_a, due, rend = [], [], [], []
    for g, read, r_abs in zip(gens, reads, rendered):
        r = r_abs - origin
        fg = queue.floor(g, keys)
        a = min(read, g + p)
        if client is not None:
            j = min(client.first + bisect.bisect_right(client_times, r) - 1, len(released) - 1)
        else:
            j = bisect.bisect_right(out_times, r) - 1
        ready_g.append(fg)
        ready_a.append(max(fg, queue.floor(a, keys)))
        due.append(released[j][1] if j >= 0 else r)
        rend.append(r)
    return TokenTimes(tuple(ready_g), tuple(ready_a), tuple(due), tuple(rend), tuple(held))


def held_times(generated: Sequence[float], sends: Sequence[tuple[float, bytes, int]]) -> tuple[float, ...]:
    """Per token, its first datagram's send minus its generation (``Http3Server.datagram_sends``' log)."""
    from eloquent_plugins.sim.timeline_record import carried

    first: dict[int, float] = {}
    for sent, datagram, _ in sends:
        for index in carried(datagram)[1]:
            first.setdefault(index, sent)
    return tuple(max(0.0, first[i] - g) if i in first else 0.0 for i, g in enumerate(generated))


def mean_terms_ms(streams: Sequence[TokenTimes], one_way: float) -> dict[str, float]:
    """Each term's mean over every token of ``streams``, in milliseconds; ``held`` only where logged, and
    ``held_tokens``: how many tokens waited more than 5 ms for the window."""
    out: dict[str, float] = {}
    for name in TERMS:
        values = [x for s in streams for x in s.terms(one_way)[name]]
        if values or name != "held":
            out[name] = 1000 * statistics.fmean(values) if values else 0.0
    if any(s.held for s in streams):
        out["held_tokens"] = float(sum(1 for s in streams for x in s.held if x > 0.005))
    return out
