"""Figures of one real-link scenario per scheme: stall, QoE, first-token delay, bytes, own and cross-flow loss.

Two stall figures, both from ``core.stall.stall_metrics``: ``stall`` against the link's floor (each token's
reference is when its packet alone could have left the bottleneck, ``TraceQueue.floor``: what the trace's gaps and
the queue ahead cost is the link's, what is left is the scheme's recovery and head-of-line blocking), and
``stall_raw`` against the base one-way delay only (the project's definition: every millisecond of queueing and
every outage counts). QoE (Andes) and the first token's delay are the user's view: against generation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from eloquent_plugins.core.stall import DEFAULT_READING_PACE, stall_metrics
from eloquent_plugins.sim.run import StreamRun


@dataclass(frozen=True, slots=True)
class LinkFigures:
    stall: float
    """Mean over streams of the stall ratio above the link's floor."""
    stall_raw: float
    qoe: float
    first_token: float
    """Mean seconds from the first token's generation to its render."""
    lateness_p95: float
    """Seconds above the floor, 95th percentile over every token."""
    bytes: int
    own_loss: float
    """Share of the scheme's own packets (both directions) the bottleneck dropped."""
    cross_bps: float | None = None
    cross_alone_bps: float | None = None
    cross_loss: float | None = None
    streams: int = 0
    stall_net: float | None = None
    """The stall above the floor on the times the network alone produced (end to end: ``cli/bench/link_terms``,
    this machine's processing re-based and taken away); the simulator has no processing: there it is ``stall``."""
    held: float | None = None
    """Mean seconds from a token's generation to its first datagram going to QUIC (the congestion window's hold;
    Eloquent inside a window only)."""
    held_tokens: float | None = None
    """Tokens (all streams) that waited more than 5 ms for the window."""

    @property
    def cross_throughput_loss(self) -> float | None:
        """What the token stream cost the cross flow: 1 - its throughput beside the stream / alone."""
        if self.cross_bps is None or not self.cross_alone_bps:
            return None
        return 1 - self.cross_bps / self.cross_alone_bps

    def as_dict(self) -> dict[str, object]:
        return {**asdict(self), "cross_throughput_loss": self.cross_throughput_loss}


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def link_figures(streams: Iterable[StreamRun], pace: float = DEFAULT_READING_PACE) -> LinkFigures:
    """``streams``: one scheme's ``StreamRun``s (with ``ready`` set) over every stream and seed."""
    runs = list(streams)
    floor = [stall_metrics(r.ready, r.rendered, r.min_delay, pace=pace) for r in runs]
    raw = [stall_metrics(r.generated, r.rendered, r.min_delay, pace=pace) for r in runs]
    late = sorted(max(0.0, x - (g + r.min_delay)) for r in runs
                  for g, x in zip(r.ready, r.rendered))
    details = [r.details for r in runs]
    packets = sum(d.get("own_packets", 0.0) for d in details)
    cross = [d for d in details if "cross_bps" in d]
    segments = sum(d["cross_segments"] for d in cross)
    windowed = [d for d in details if "held_mean" in d]
    return LinkFigures(
        stall=(stall := _mean([m.stall_ratio for m in floor])), stall_net=stall, stall_raw=_mean([m.stall_ratio for m in raw]),
        qoe=_mean([m.qoe for m in raw]),
        first_token=_mean([r.rendered[0] - r.generated[0] for r in runs]),
        lateness_p95=late[int(0.95 * (len(late) - 1))] if late else 0.0,
        bytes=sum(r.bytes_sent for r in runs),
        own_loss=sum(d.get("own_queue_drops", 0.0) for d in details) / packets if packets else 0.0,
        cross_bps=_mean([d["cross_bps"] for d in cross]) if cross else None,
        cross_alone_bps=_mean([d["cross_alone_bps"] for d in cross if "cross_alone_bps" in d]) if cross else None,
        cross_loss=sum(d["cross_lost"] for d in cross) / segments if segments else None,
        streams=len(runs),
        held=_mean([d["held_mean"] for d in windowed]) if windowed else None,
        held_tokens=sum(d["held_tokens"] for d in windowed) if windowed else None)


def format_links_table(rows: Sequence[tuple[str, dict[str, LinkFigures]]]) -> str:
    header = (f"{'link':<34} {'scheme':<20} {'stall':>6} {'net':>6} {'raw':>6} {'QoE':>6} {'1st ms':>7} {'p95 ms':>7} "
              f"{'KB':>7} {'loss':>6} {'x Mb/s':>7} {'x cost':>7} {'x loss':>7} {'held':>9}")
    lines = [header, "-" * len(header)]
    for label, schemes in rows:
        for i, (name, f) in enumerate(schemes.items()):
            cross = (f"{'-':>7} {'-':>7} {'-':>7}" if f.cross_bps is None else
                     f"{f.cross_bps / 1e6:>7.2f} {f.cross_throughput_loss or 0.0:>7.2%} {f.cross_loss or 0.0:>7.2%}")
            held = "" if f.held is None else f"{f.held * 1000:>5.1f}/{f.held_tokens or 0:.0f}"
            net = "" if f.stall_net is None else f"{f.stall_net:.3f}"
            lines.append(f"{label if i == 0 else '':<34} {name:<20} {f.stall:>6.3f} {net:>6} {f.stall_raw:>6.3f} "
                         f"{f.qoe:>6.3f} {f.first_token * 1000:>7.0f} {f.lateness_p95 * 1000:>7.0f} "
                         f"{f.bytes / 1024:>7.1f} {f.own_loss:>6.2%} {cross} {held:>9}".rstrip())
    return "\n".join(lines)
