"""``eloquent bench e2e --trace NAME [--cross]``: the three schemes end to end over a cellular trace pair, the relay's
two directions drained at the trace's opportunities (one queue per direction shared by every client), optionally
beside a real bulk download through the same relay and queue.

The bulk download is an HTTP/3 GET of an endless body from the same front end (``/bulk`` beside the engine), over
QUIC with the front end's congestion control: the kernel's TCP cannot be routed through a user-space UDP relay
here (that would need a TUN device and a network namespace), and a split TCP proxy could not drop its packets, so
the cross flow is congestion-controlled traffic whose losses come from the same queue as the token streams'.

Request i starts ``links.WARMUP + i * links.stream_span`` after the relay, the place stream i of the simulator's
run takes in the trace (``sim.links``), so ``bench sim --links traces`` and this bench sample the same seconds.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from eloquent_plugins.cli.harness import (
    SCHEMES,
    Conditions,
    E2EResult,
    Harness,
    Workload,
    client_for,
    harness,
    reference_texts,
    stagger_offsets,
    stream_once,
)
from eloquent_plugins.core.stall import stall_metrics
from eloquent_plugins.sim.links import WARMUP, RealLink, load_real_link, stream_offset, stream_span
from eloquent_plugins.sim.links_report import LinkFigures
from eloquent_plugins.transports.asgi import ASGIApp, Receive, Scope, Send

BULK_PATH = "/bulk"
BULK_CHUNK = 16 * 1024
BULK_LIMIT = 512 * 1024 * 1024
"""The bulk body's ceiling: far more than any trace here carries in a run; the client cancels it first."""


def bulk_app(inner: ASGIApp) -> ASGIApp:
    """``inner`` with ``GET /bulk`` beside it: an octet stream until the client goes away (or BULK_LIMIT)."""
    chunk = bytes(BULK_CHUNK)

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("type") != "http" or scope.get("path") != BULK_PATH:
            await inner(scope, receive, send)
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/octet-stream")]})
        sent = 0
        while sent < BULK_LIMIT:  # the front end's send waits while the stream's buffer is full
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            sent += len(chunk)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


@dataclass(slots=True)
class BulkDownload:
    """The cross flow's client: one QUIC connection through the relay, bytes counted as they arrive."""

    arrivals: list[tuple[float, int]] = field(default_factory=list)
    error: str | None = None
    _task: asyncio.Task[None] | None = None
    _conn: Any = None

    async def start(self, host: str, port: int) -> None:
        from eloquent_client.http3 import Http3ClientConnection

        self._conn = await Http3ClientConnection.connect(host, port, verify=False, idle_timeout=60.0)
        self._task = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        stream = await self._conn.request("GET", BULK_PATH)
        try:
            await stream.wait_headers(30.0)
            items = stream._items  # the raw body's chunks as they come (read() would only give the whole body)
            while True:
                item = await items.get()
                if item is None or isinstance(item, BaseException):
                    if isinstance(item, BaseException):
                        self.error = f"{type(item).__name__}: {item}"
                    return
                if isinstance(item, bytes):
                    self.arrivals.append((time.monotonic(), len(item)))
        finally:
            stream.cancel()

    def throughput(self, start: float, end: float) -> float:
        """Bits per second received in [start, end) (monotonic seconds)."""
        got = sum(n for t, n in self.arrivals if start <= t < end)
        return got * 8 / (end - start) if end > start else 0.0

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._conn is not None:
            await self._conn.close()


@dataclass(slots=True)
class LinkE2E:
    result: E2EResult
    figures: dict[str, LinkFigures]
    window: tuple[float, float]
    elapsed: float


def _floor_times(h: Harness, generated: list[float]) -> list[float]:
    queue = h.relay.queues.get("down")
    if queue is None:
        return list(generated)
    origin = h.relay.origin
    arrivals = [a for a, _ in queue.tail]
    return [queue.floor(g - origin, arrivals) + origin for g in generated]


async def _bulk_alone(conditions: Conditions, workload: Workload, window: tuple[float, float],
                      origin: float) -> float:
    """The same trace seconds with only the bulk download: its throughput over the same window."""
    async with harness(conditions, workload, wrap=bulk_app) as h:
        bulk = BulkDownload()
        await bulk.start(*h.relay.listen_addr)
        shift = h.relay.origin - origin
        await asyncio.sleep(max(0.0, window[1] + shift - time.monotonic()))
        await bulk.stop()
        return bulk.throughput(window[0] + shift, window[1] + shift)


async def run_link_e2e(conditions: Conditions, workload: Workload, *, cross: bool, redundancy: str | None = None,
                       baseline: bool = True) -> LinkE2E:
    started = time.monotonic()
    result = E2EResult(conditions, workload)
    span = stream_span(workload.max_tokens, workload.tpot, workload.ttft)
    per_client: dict[str, Any] = {}
    floors: dict[int, list[float]] = {}
    bulk = BulkDownload() if cross else None
    async with harness(conditions, workload, redundancy=redundancy, wrap=bulk_app if cross else None) as h:
        clients = {scheme: client_for(scheme, h.relay_url) for scheme in SCHEMES}
        try:
            for client in clients.values():  # one after another: relay client k is scheme k
                await client.connection()
            if bulk is not None:
                await bulk.start(*h.relay.listen_addr)
            offsets = stagger_offsets(len(SCHEMES), workload.tpot, conditions.one_way)
            first = h.relay.origin + WARMUP
            for i in range(workload.requests):
                await asyncio.sleep(max(0.0, h.relay.origin + WARMUP + i * span - time.monotonic()))
                runs = await asyncio.gather(*(stream_once(h, clients[s], s, i, workload.max_tokens,
                                                          delay=offsets[k]) for k, s in enumerate(SCHEMES)))
                result.streams.extend(runs)
            window = (first, time.monotonic())
        finally:
            if bulk is not None:
                await bulk.stop()
            for client in clients.values():
                await client.aclose()
        for run in result.streams:
            if run.error is None:
                floors[id(run)] = _floor_times(h, run.generated)
        for k, scheme in enumerate(SCHEMES):
            per_client[scheme] = h.relay.client_stats(k)
        bulk_stats = h.relay.client_stats(len(SCHEMES)) if bulk is not None else None
        origin = h.relay.origin
        result.relay_stats = h.relay.stats
        result.references = await reference_texts(h, workload)
    result.score()
    alone = None
    if bulk is not None and baseline:
        alone = await _bulk_alone(conditions, workload, window, origin)
    # The stall reference above the floor, measured as the harness measures its own: the smallest render minus
    # floor over every token (one-way delay plus this machine's processing), so processing is not counted late.
    gaps = [x - f for r in result.streams if id(r) in floors for f, x in zip(floors[id(r)], r.rendered)]
    d = max(0.0, min(gaps)) if gaps else conditions.one_way
    figures: dict[str, LinkFigures] = {}
    for scheme in SCHEMES:
        runs = [r for r in result.streams if r.scheme == scheme and r.error is None and r.report is not None]
        if not runs:
            continue
        floor = [stall_metrics(floors[id(r)], r.rendered, d) for r in runs]
        late = sorted(max(0.0, x - (f + d)) for r in runs for f, x in zip(floors[id(r)], r.rendered))
        own = per_client[scheme]
        packets = own["up"].received + own["down"].received
        drops = own["up"].queue_dropped + own["down"].queue_dropped
        figures[scheme] = LinkFigures(
            stall=sum(m.stall_ratio for m in floor) / len(floor),
            stall_raw=sum(r.report.stall_ratio for r in runs) / len(runs),  # type: ignore[union-attr]
            qoe=sum(r.report.qoe for r in runs) / len(runs),  # type: ignore[union-attr]
            first_token=sum(r.rendered[0] - r.generated[0] for r in runs) / len(runs),
            lateness_p95=late[int(0.95 * (len(late) - 1))] if late else 0.0,
            bytes=own["up"].bytes_forwarded + own["down"].bytes_forwarded,
            own_loss=drops / packets if packets else 0.0,
            cross_bps=None if bulk is None else bulk.throughput(*window),
            cross_alone_bps=alone,
            cross_loss=(None if bulk_stats is None or not bulk_stats["down"].received
                        else bulk_stats["down"].queue_dropped / bulk_stats["down"].received),
            streams=len(runs))
    return LinkE2E(result, figures, window, time.monotonic() - started)


E2E_NAMES = {"eloquent": "eloquent", "stream": "retransmission", "duplicate": "duplication"}
"""The simulator's names for the end-to-end schemes (HTTP/3 reliable stream = retransmission)."""


def link_conditions(name: str, *, rtt: float, seed: int, requests: int, workload: Workload,
                    queue_packets: int) -> tuple[Conditions, RealLink]:
    link = load_real_link(name, queue_packets)
    span = stream_span(workload.max_tokens, workload.tpot, workload.ttft)
    return Conditions(loss=0.0, burst=1.0, rtt=rtt, seed=seed, link=link,
                      link_offset=stream_offset((seed - 1) * requests, span)), link


def run_trace(args: Any, workload: Workload) -> int:
    from eloquent_plugins.sim.links_report import format_links_table

    conditions, _ = link_conditions(args.trace, rtt=args.rtt, seed=args.seed, requests=workload.requests,
                                    workload=workload, queue_packets=args.queue_packets)
    out = asyncio.run(run_link_e2e(conditions, workload, cross=args.cross, redundancy=args.redundancy,
                                   baseline=not args.no_cross_baseline))
    label = f"link={args.trace},cross={int(args.cross)}" + (f",redundancy={args.redundancy}"
                                                             if args.redundancy else "")
    named = {(E2E_NAMES[k] if not args.redundancy or k != "eloquent" else f"eloquent-{args.redundancy}"): v
             for k, v in out.figures.items()}
    print(format_links_table([(label, named)]))
    summary = out.result.summary()
    print(f"\n{workload.requests} requests x {workload.max_tokens} tokens per scheme, {out.elapsed:.0f} s; text "
          f"identical: {summary['text_identical']}, all completed: {summary['all_completed']}")
    for stream in out.result.streams:
        if stream.error:
            print(f"  {stream.scheme} request {stream.request}: {stream.error}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fp:
            json.dump({"meta": {"argv": sys.argv[1:]}, "label": label,
                       "schemes": {k: v.as_dict() for k, v in named.items()}}, fp, indent=2)
    return 0 if summary["text_identical"] and summary["all_completed"] else 1
