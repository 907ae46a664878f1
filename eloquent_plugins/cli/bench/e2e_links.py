"""``eloquent bench e2e --trace NAME [--cross]``: the three schemes end to end over a cellular trace pair, the relay's
two directions drained at the trace's opportunities, optionally beside a real bulk download (``e2e_bulk``).

Like for like with ``bench sim --links traces`` (issue 30): by default each scheme runs **alone**, and each of its
requests on a **fresh** relay, queue and QUIC connection, as each stream of the simulator starts on empty queues
and a fresh connection: request i's relay starts its trace at the second stream i of the simulator's run starts
at (``links.stream_offset``), its first token is generated ``links.WARMUP`` s later and its bulk download starts
``WARMUP`` s before that. ``--one-path`` runs a scheme's requests one after another through one relay and one
connection instead (request i's first token at ``WARMUP + i * links.stream_span``: a later request meets what an
earlier one left in the queue and in the congestion controller, as on one phone); ``--shared-queue`` also runs
the schemes at once through that relay (one queue per direction and one download shared by all).

Beside the table's stall above the link's floor (``core.stall`` against ``TraceQueue.floor``), each row gives the
**network-only** stall (``link_terms``): the same ratio on the times the network alone produced, with this
machine's processing before the bottleneck re-based and after it taken away, and the per-token terms.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import time
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, fields, replace
from typing import Any

from eloquent_plugins.cli.bench.e2e_bulk import BulkSchedule, bulk_alone, bulk_app, sleep_until
from eloquent_plugins.cli.bench.link_terms import (
    ClientArrivals,
    TokenTimes,
    held_times,
    log_arrivals,
    mean_terms_ms,
    token_times,
)
from eloquent_plugins.cli.harness import (
    SCHEMES,
    Conditions,
    E2EResult,
    Harness,
    StreamResult,
    Workload,
    client_for,
    harness,
    reference_texts,
    stagger_offsets,
    stream_once,
)
from eloquent_plugins.core.errors import EloquentError
from eloquent_plugins.core.stall import stall_metrics
from eloquent_plugins.sim.links import LINK_WINDOW, WARMUP, RealLink, load_real_link, stream_offset, stream_span
from eloquent_plugins.sim.links_report import LinkFigures
from eloquent_plugins.sim.udp_relay import DirectionStats


CONGESTION_CONTROL = LINK_WINDOW
"""The front end's congestion control on a trace: the simulator's TCP flows (the bulk download, retransmission)
are CUBIC, so the real ones are too (the front end's default is Reno), and the simulator's Eloquent runs inside
the same aioquic controller (``sim.quic_window``)."""


SETTLE_RTTS = 4
"""Round trips the bench waits, still off the trace, once its connections report ready (``settle_off_trace``)."""
SETTLE_LIMIT = 5.0
"""Seconds past that wait a connection may still have packets in flight before the run is called off."""


async def settle_off_trace(h: Harness) -> None:
    """Wait, the relay still keeping packets off the trace, until every connection's handshake is over on the
    server's side too: a client reports its connection ready when it sends its Finished, and the server's last
    handshake packet (HANDSHAKE_DONE, its new connection IDs, HTTP/3's control streams) leaves half a round trip
    later. Let through on the trace it met the stretch under test: in an outage it was lost, aioquic's probe timer
    backed off and CUBIC's window restarted before the first request, a connection the simulator's never is
    (docs/results/real-links.md, point 11). At least ``SETTLE_RTTS`` round trips (0.25 s at the least), then until
    the server has nothing in flight, at most ``SETTLE_LIMIT`` s more: past that the run stops with an error."""
    await asyncio.sleep(max(0.25, SETTLE_RTTS * h.conditions.rtt))
    deadline = time.monotonic() + SETTLE_LIMIT
    while h.server.bytes_in_flight:
        if time.monotonic() >= deadline:
            raise EloquentError(f"bench e2e: the server still has {h.server.bytes_in_flight} bytes in flight "
                                f"{SETTLE_LIMIT:g} s after its connections' handshakes; the trace would meet them")
        await asyncio.sleep(0.01)


@dataclass(slots=True)
class GroupRun:
    """Schemes that ran together through one relay: their streams, per-token times and the relay's counts."""

    streams: list[StreamResult] = field(default_factory=list)
    times: dict[int, TokenTimes] = field(default_factory=dict)
    """id(stream) -> its token times."""
    own: dict[str, Any] = field(default_factory=dict)
    cross_bps: list[float] = field(default_factory=list)
    """Per request: the bulk download's bits per second over the request's tokens."""
    cross_dropped: int = 0
    cross_received: int = 0
    starts: list[float] = field(default_factory=list)
    windows: list[tuple[float, float]] = field(default_factory=list)
    origin: float = 0.0
    first_token_shift: list[float] = field(default_factory=list)
    """Per stream: its first token's place in the trace minus the simulator's stream's (seconds)."""


async def _run_group(conditions: Conditions, workload: Workload, schemes: tuple[str, ...], *, cross: bool,
                     redundancy: str | None, requests: range, references: bool) -> tuple[GroupRun, list[str]]:
    """``schemes`` at once through one fresh relay whose trace starts at ``conditions.link_offset``, for the
    requests ``requests`` one after another (the first at ``WARMUP`` s, each next one ``span`` s later); with
    ``references``, also every request's text asked without streaming (the same on every relay: asked once)."""
    span = stream_span(workload.max_tokens, workload.tpot, workload.ttft)
    lead = workload.ttft + conditions.one_way  # the request's trip up and the engine's first token
    out = GroupRun()
    async with harness(conditions, workload, record=True, redundancy=redundancy, wrap=bulk_app if cross else None,
                       congestion_control=CONGESTION_CONTROL) as h:
        clients = {scheme: client_for(scheme, h.relay_url) for scheme in schemes}
        logs: dict[str, ClientArrivals] = {}
        schedule = BulkSchedule(h.relay.listen_addr) if cross else None
        origin = out.origin = h.relay.origin
        h.relay.trace_from = math.inf  # the handshakes off the trace: the simulator's connections exist already
        try:
            for scheme, client in clients.items():  # one after another: relay client k is scheme k
                logs[scheme] = log_arrivals(await client.connection())
            if schedule is not None:
                await schedule.prepare(len(requests))
            await settle_off_trace(h)
            h.relay.trace_from = h.relay.elapsed()
            offsets = stagger_offsets(len(schemes), workload.tpot, conditions.one_way)
            for i in requests:
                base = origin + (i - requests.start) * span
                if schedule is not None:
                    await schedule.begin(base)
                await sleep_until(base + WARMUP - lead)
                runs = await asyncio.gather(*(stream_once(h, clients[s], s, i, workload.max_tokens, delay=offsets[k])
                                              for k, s in enumerate(schemes)))
                out.streams.extend(runs)
                made = [r.generated for r in runs if r.error is None and r.generated]
                window = (min(g[0] for g in made), max(g[-1] for g in made)) if made else (base, time.monotonic())
                out.starts.append(base)
                out.windows.append(window)
                out.first_token_shift += [g[0] - (base + WARMUP) for g in made]
                if schedule is not None:
                    await schedule.end(window)
        finally:
            if schedule is not None:
                await schedule.close()
            for client in clients.values():
                await client.aclose()
        queue = h.relay.queues["down"]
        for k, scheme in enumerate(schemes):
            out.own[scheme] = h.relay.client_stats(k)
            down = h.relay.record_of(k, "down")
            for run in out.streams:
                if run.scheme == scheme and run.error is None:
                    sends = h.server.datagram_sends(run.request_id) if run.request_id else None
                    held = held_times(run.generated, sends[1]) if sends is not None else ()
                    out.times[id(run)] = token_times(queue, run.generated, run.rendered, down, origin, logs[scheme],
                                                     held).only(run.content)
        if schedule is not None:
            out.cross_bps = schedule.each_throughput()
            bulk = [h.relay.client_stats(k)["down"] for k in range(len(schemes), h.relay.stats.clients)]
            out.cross_received = sum(s.received for s in bulk)
            out.cross_dropped = sum(s.queue_dropped for s in bulk)
        texts = await reference_texts(h, workload) if references else []
    return out, texts


@dataclass(slots=True)
class LinkE2E:
    result: E2EResult
    figures: dict[str, LinkFigures]
    terms_ms: dict[str, dict[str, float]]
    """Per scheme, the mean per-token terms (``link_terms``: pre, net, post) in ms."""
    first_token_shift: list[float]
    elapsed: float
    path_offsets: list[float] = field(default_factory=list)
    """Where each relay of a scheme started its trace (seconds): one per request, or one for all."""
    per_stream: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    """Per scheme, per stream in request order: its stall, network-only stall and mean terms (ms)."""


def _merge(runs: list[GroupRun]) -> GroupRun:
    """One scheme group's per-request runs (each on its own relay) as one: streams, times and counts together."""
    if len(runs) == 1:
        return runs[0]
    out = GroupRun()
    for run in runs:
        out.streams += run.streams
        out.times.update(run.times)
        out.cross_bps += run.cross_bps
        out.cross_dropped += run.cross_dropped
        out.cross_received += run.cross_received
        out.first_token_shift += run.first_token_shift
        for scheme, own in run.own.items():
            into = out.own.setdefault(scheme, {"up": DirectionStats(), "down": DirectionStats()})
            for direction, stats in own.items():
                total = into[direction]
                for f in fields(DirectionStats):
                    setattr(total, f.name, getattr(total, f.name) + getattr(stats, f.name))
    return out


async def run_link_e2e(conditions: Conditions, workload: Workload, *, cross: bool, redundancy: str | None = None,
                       baseline: bool = True, schemes: tuple[str, ...] = SCHEMES,
                       shared_queue: bool = False, one_path: bool = False) -> LinkE2E:
    """``one_path`` (implied by ``shared_queue``): a group's requests one after another on one relay; otherwise
    each request on its own, its relay's trace starting where the simulator's stream of that index starts."""
    started = time.monotonic()
    result = E2EResult(conditions, workload)
    span = stream_span(workload.max_tokens, workload.tpot, workload.ttft)
    if shared_queue or one_path:
        paths = [(conditions, range(workload.requests))]
    else:
        paths = [(replace(conditions, link_offset=conditions.link_offset + stream_offset(i, span)), range(i, i + 1))
                 for i in range(workload.requests)]
    groups: list[tuple[tuple[str, ...], GroupRun]] = []
    first: list[tuple[Conditions, GroupRun]] = []
    for group in ((schemes,) if shared_queue else tuple((s,) for s in schemes)):
        parts = []
        for path, requests in paths:
            run, texts = await _run_group(path, workload, group, cross=cross, redundancy=redundancy,
                                          requests=requests, references=not result.references)
            result.references = result.references or texts
            parts.append(run)
            if not groups:
                first.append((path, run))
        run = _merge(parts)
        groups.append((group, run))
        result.streams.extend(run.streams)
    result.score()
    alone = None
    if cross and baseline:
        each: list[float] = []
        for path, run in first:  # the download alone over the same trace seconds as beside the first group

            def fresh(path: Conditions = path) -> AbstractAsyncContextManager[Any]:
                return harness(path, workload, wrap=bulk_app, congestion_control=CONGESTION_CONTROL)

            each += [await bulk_alone(fresh, run.windows, run.starts, run.origin)] * len(run.windows)
        alone = sum(each) / len(each) if each else None
    times = {k: v for _, run in groups for k, v in run.times.items()}
    # The table's reference above the floor, measured as the harness measures its own: the smallest render minus
    # floor over every token of the row (one-way delay plus this machine's processing).
    gaps = [r - g for t in times.values() for g, r in zip(t.ready_g, t.rendered)]
    d = max(0.0, min(gaps)) if gaps else conditions.one_way
    one_way = conditions.one_way
    figures: dict[str, LinkFigures] = {}
    terms: dict[str, dict[str, float]] = {}
    per_stream: dict[str, list[dict[str, float]]] = {}
    for group, run in groups:
        for scheme in group:
            runs = [r for r in run.streams if r.scheme == scheme and id(r) in run.times and r.report is not None]
            if not runs:
                continue
            tt = [run.times[id(r)] for r in runs]
            own = run.own[scheme]
            packets = own["up"].received + own["down"].received
            late = sorted(max(0.0, x - (f + d)) for t in tt for f, x in zip(t.ready_g, t.rendered))
            stalls = [stall_metrics(t.ready_g, t.rendered, d).stall_ratio for t in tt]
            nets = [t.network_stall(one_way) for t in tt]
            figures[scheme] = LinkFigures(
                stall=sum(stalls) / len(tt),
                stall_raw=sum(r.report.stall_ratio for r in runs) / len(runs),  # type: ignore[union-attr,misc]
                qoe=sum(r.report.qoe for r in runs) / len(runs),  # type: ignore[union-attr,misc]
                first_token=sum(r.rendered[0] - r.generated[0] for r in runs) / len(runs),
                lateness_p95=late[int(0.95 * (len(late) - 1))] if late else 0.0,
                bytes=own["up"].bytes_forwarded + own["down"].bytes_forwarded,
                own_loss=(own["up"].queue_dropped + own["down"].queue_dropped) / packets if packets else 0.0,
                cross_bps=sum(run.cross_bps) / len(run.cross_bps) if run.cross_bps else None, cross_alone_bps=alone,
                cross_loss=run.cross_dropped / run.cross_received if run.cross_received else None, streams=len(runs),
                stall_net=sum(nets) / len(tt))
            terms[scheme] = mean_terms_ms(tt, one_way)
            per_stream[scheme] = [{"request": r.request, "stall_net": net, "stall": stall,
                                   **mean_terms_ms([t], one_way)} for r, t, stall, net in zip(runs, tt, stalls, nets)]
    shifts = [x for _, run in groups for x in run.first_token_shift]
    return LinkE2E(result, figures, terms, shifts, time.monotonic() - started,
                   [path.link_offset for path, _ in paths], per_stream)


E2E_NAMES = {"eloquent": "eloquent", "stream": "retransmission", "duplicate": "duplication"}
"""The simulator's names for the end-to-end schemes (HTTP/3 reliable stream = retransmission)."""


def link_conditions(name: str, *, rtt: float, seed: int, requests: int, workload: Workload,
                    queue_packets: int) -> tuple[Conditions, RealLink]:
    link = load_real_link(name, queue_packets)
    span = stream_span(workload.max_tokens, workload.tpot, workload.ttft)
    return Conditions(loss=0.0, burst=1.0, rtt=rtt, seed=seed, link=link,
                      link_offset=stream_offset((seed - 1) * requests, span)), link


def run_record(args: Any, conditions: Conditions, workload: Workload) -> dict[str, Any]:
    """The conditions a ``--trace`` run ran in, as its JSON records them (``meta.run``; ``bench sim --against``
    checks its row against them)."""
    return {"trace": args.trace, "cross": bool(args.cross), "rtt": conditions.rtt, "seed": args.seed,
            "tokens": workload.max_tokens, "tpot": workload.tpot, "ttft": workload.ttft,
            "queue_packets": args.queue_packets, "redundancy": args.redundancy, "one_path": args.one_path,
            "shared_queue": args.shared_queue}


def run_trace(args: Any, workload: Workload) -> int:
    from eloquent_plugins.sim.links_report import format_links_table

    conditions, _ = link_conditions(args.trace, rtt=args.rtt, seed=args.seed, requests=workload.requests,
                                    workload=workload, queue_packets=args.queue_packets)
    schemes = tuple(s for s in SCHEMES if s in (args.scheme or SCHEMES))
    out = asyncio.run(run_link_e2e(conditions, workload, cross=args.cross, redundancy=args.redundancy,
                                   baseline=not args.no_cross_baseline, schemes=schemes,
                                   shared_queue=args.shared_queue, one_path=args.one_path))
    label = f"link={args.trace},cross={int(args.cross)}" + (f",redundancy={args.redundancy}"
                                                             if args.redundancy else "")

    def name(k: str) -> str:
        return E2E_NAMES[k] if not args.redundancy or k != "eloquent" else f"eloquent-{args.redundancy}"

    named = {name(k): v for k, v in out.figures.items()}
    print(format_links_table([(label, named)]))
    print("\nper-token terms above the link's floor, mean ms (pre: processing before the bottleneck, as the trace "
          "makes it cost; net: the network and the scheme's recovery; post: relay timer and client):")
    for k, t in out.terms_ms.items():
        held = (f"  (held by QUIC's window {t['held']:.2f}, {t['held_tokens']:.0f} tokens over 5 ms)"
                if "held" in t else "")
        print(f"  {name(k):<20} pre {t['pre']:8.2f}  net {t['net']:8.2f}  post {t['post']:8.2f}{held}")
    shifts = out.first_token_shift
    summary = out.result.summary()
    print(f"\n{workload.requests} requests x {workload.max_tokens} tokens per scheme, "
          f"{'one relay for all' if args.shared_queue else 'each scheme alone'}"
          f"{'' if args.shared_queue or args.one_path else ', each request on its own relay'}, "
          f"{out.elapsed:.0f} s; first tokens {min(shifts, default=0) * 1000:+.0f} to "
          f"{max(shifts, default=0) * 1000:+.0f} ms from the simulator's place in the trace; text identical: "
          f"{summary['text_identical']}, all completed: {summary['all_completed']}")
    for stream in out.result.streams:
        if stream.error:
            print(f"  {stream.scheme} request {stream.request}: {stream.error}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fp:
            json.dump({"meta": {"argv": sys.argv[1:], "run": run_record(args, conditions, workload)}, "label": label,
                       "schemes": {name(k): v.as_dict() for k, v in out.figures.items()},
                       "terms_ms": {name(k): v for k, v in out.terms_ms.items()},
                       "first_token_shift": shifts, "path_offsets": out.path_offsets,
                       "per_stream": {name(k): v for k, v in out.per_stream.items()}}, fp, indent=2)
    return 0 if summary["text_identical"] and summary["all_completed"] else 1
