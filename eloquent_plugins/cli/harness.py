# long: one harness (conditions, servers, relay, clients, staggering, stall scoring) for demo, chat and bench e2e
"""The in-process end-to-end harness: the built-in engine behind the HTTP/3 front end behind the lossy relay,
one client per scheme, and the stall scoring of what they rendered.

Shared by ``eloquent demo``, ``eloquent chat`` (no ``--url``) and ``eloquent bench e2e``: it lives here, beside
``commands/`` and ``bench/``, so that commands -> harness <- bench and neither of those two imports the other.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.flags import add_duration
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.stall import StallReport, percentile, stall_metrics
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.sim.netem import LossSchedule, Outage, PathConfig
from eloquent_plugins.sim.links import RealLink
from eloquent_plugins.sim.relay_record import Bottleneck
from eloquent_plugins.sim.udp_relay import Relay, RelayConfig, start_relay
from eloquent_plugins.transports.asgi import ASGIApp
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.http3.server import Http3Server, start_http3_server

SCHEMES = ("eloquent", "stream", "duplicate")
LABELS = {"eloquent": "Eloquent (datagrams)", "stream": "HTTP/3 stream (retransmission)",
          "duplicate": "duplication (datagrams x2)"}
MODEL = "eloquent-builtin"


def stagger_offsets(streams: int, tpot: float, one_way: float, *, steps: int = 240) -> list[float]:
    """Start offsets (seconds) for ``streams`` streams served, relayed and read by one process, chosen so that no
    two of them need its CPU at the same instant: a token costs work when it leaves the server (offset ``o``),
    when it reaches the client (``o + one_way``) and when its acknowledgement is back (``o + 2 one_way``), all
    modulo ``tpot``. An even split of ``tpot`` is not enough: at RTT 100 ms and TPOT 30 ms a hop is 50 = 20 (mod 30)
    ms, so each stream's client work fell on the next stream's server work (issue 19: that collision, not the
    protocol, was most of the datagram path's lossless stall floor). Greedy: each next offset maximises the
    smallest circular distance between its three instants and all those already placed."""
    if streams < 1 or tpot <= 0:
        return [0.0] * max(streams, 0)

    def instants(offset: float) -> list[float]:
        return [(offset + hop * one_way) % tpot for hop in range(3)]

    def distance(a: float, b: float) -> float:
        d = abs(a - b) % tpot
        return min(d, tpot - d)

    offsets = [0.0]
    placed = instants(0.0)
    for _ in range(1, streams):
        best = max((tpot * j / steps for j in range(steps)),
                   key=lambda o: min(distance(x, y) for x in instants(o) for y in placed))
        offsets.append(best)
        placed += instants(best)
    return offsets


@dataclass(frozen=True, slots=True)
class Conditions:
    loss: float = 0.10
    burst: float = 2.0
    rtt: float = 0.100
    jitter: float = 0.0
    loss_schedule: LossSchedule | None = None
    outages: tuple[Outage, ...] = ()
    seed: int = 1
    bottleneck: Bottleneck | None = None
    """A rate and drop-tail queue every client's server -> client packets share (loss from queue overflow)."""
    link: RealLink | None = None
    """A cellular trace pair (``sim.links``): the relay's two directions drain at its opportunities."""
    link_offset: float = 0.0
    """Where in the trace the relay starts (seconds)."""

    @property
    def one_way(self) -> float:
        return self.rtt / 2

    def path(self) -> PathConfig:
        return PathConfig(delay=self.one_way, jitter=self.jitter, loss=self.loss, burst=self.burst,
                          loss_schedule=self.loss_schedule)

    def paths(self) -> tuple[PathConfig, PathConfig]:
        """(upstream, downstream): the same path both ways, or a real link's ``.up`` and ``.down``."""
        path = self.path()
        if self.link is None:
            return path, path
        down, up = self.link.paths(path, self.link_offset)
        return up, down


@dataclass(frozen=True, slots=True)
class Workload:
    requests: int = 8
    max_tokens: int = 150
    ttft: float = 0.2
    tpot: float = 0.03


@dataclass(slots=True)
class StreamResult:
    scheme: str
    request: int
    text: str
    generated: list[float]
    rendered: list[float]
    delivery: str
    fallback_events: int = 0
    error: str | None = None
    report: StallReport | None = None
    request_id: str | None = None
    content: list[bool] = field(default_factory=list)
    """Per rendered event: whether it carried text (a token; the role, finish and ``[DONE]`` chunks do not)."""


@dataclass(slots=True)
class SchemeSummary:
    scheme: str
    streams: int
    completed: int
    text_identical: bool
    stall_ratio_mean: float
    stall_ratio_pooled: float
    stall_time_mean: float
    lateness_p50: float
    lateness_p95: float
    lateness_p99: float
    lateness_max: float
    qoe_mean: float
    fallback_events: int


@dataclass(slots=True)
class E2EResult:
    conditions: Conditions
    workload: Workload
    streams: list[StreamResult] = field(default_factory=list)
    references: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    relay_stats: Any = None
    timelines: list[dict[str, Any]] = field(default_factory=list)
    """Per-token timelines (``bench e2e --timeline``), see ``cli/bench/timeline.py``."""
    flow_loss: dict[str, float] = field(default_factory=dict)
    """Per scheme, the share of its server -> client packets the relay dropped (with a recording relay)."""
    min_delay: float = 0.0
    """The stall reference d: the smallest render - generation gap any event of any scheme saw in this run,
    i.e. the path's one-way delay plus the fixed cost of relaying and processing a packet."""

    def score(self) -> None:
        """Compute every stream's stall report against one common ``min_delay``."""
        gaps = [r - g for s in self.streams if s.error is None for g, r in zip(s.generated, s.rendered)]
        self.min_delay = max(0.0, min(gaps)) if gaps else self.conditions.one_way
        for s in self.streams:
            if s.error is None and s.generated:
                s.report = stall_metrics(s.generated, s.rendered, self.min_delay)

    def summaries(self) -> dict[str, SchemeSummary]:
        out: dict[str, SchemeSummary] = {}
        for scheme in SCHEMES:
            runs = [s for s in self.streams if s.scheme == scheme]
            if not runs:
                continue
            reports = [s.report for s in runs if s.report is not None]
            lateness = [max(0.0, r - (g + self.min_delay)) for s in runs if s.report is not None
                        for g, r in zip(s.generated, s.rendered)]
            duration = sum(r.duration for r in reports)
            out[scheme] = SchemeSummary(
                scheme=scheme, streams=len(runs), completed=sum(1 for s in runs if s.error is None),
                text_identical=all(s.error is None and s.text == self.references[s.request] for s in runs),
                stall_ratio_mean=statistics.fmean(r.stall_ratio for r in reports) if reports else float("nan"),
                stall_ratio_pooled=sum(r.stall_time for r in reports) / duration if duration else 0.0,
                stall_time_mean=statistics.fmean(r.stall_time for r in reports) if reports else float("nan"),
                lateness_p50=percentile(lateness, 50), lateness_p95=percentile(lateness, 95),
                lateness_p99=percentile(lateness, 99), lateness_max=max(lateness, default=0.0),
                qoe_mean=statistics.fmean(r.qoe for r in reports) if reports else float("nan"),
                fallback_events=sum(s.fallback_events for s in runs))
        return out

    def summary(self) -> dict[str, Any]:
        s = self.summaries()

        def reduction(baseline: str) -> float | None:
            if "eloquent" not in s or baseline not in s:
                return None
            base = s[baseline].stall_ratio_mean
            return None if not base else 1 - s["eloquent"].stall_ratio_mean / base

        return {"stall_reduction_vs_retransmission": reduction("stream"),
                "stall_reduction_vs_duplication": reduction("duplicate"),
                "text_identical": all(x.text_identical for x in s.values()),
                "all_completed": all(x.completed == x.streams for x in s.values())}

    def as_json(self) -> dict[str, Any]:
        c = self.conditions
        return {
            "conditions": {"loss": c.loss, "burst": c.burst, "rtt": c.rtt, "jitter": c.jitter, "seed": c.seed,
                           "outages": [asdict(o) for o in c.outages],
                           "loss_schedule": list(c.loss_schedule.points) if c.loss_schedule else None},
            "workload": asdict(self.workload),
            "elapsed": self.elapsed,
            "min_delay": self.min_delay,
            "schemes": {k: asdict(v) for k, v in self.summaries().items()},
            "streams": [{"scheme": s.scheme, "request": s.request, "delivery": s.delivery, "error": s.error,
                         "events": len(s.rendered), "fallback_events": s.fallback_events,
                         "stall": s.report.as_dict() if s.report else None} for s in self.streams],
            "summary": self.summary(),
        }


def request_body(index: int, max_tokens: int, *, stream: bool = True) -> dict[str, Any]:
    return {"model": MODEL, "stream": stream, "max_tokens": max_tokens, "seed": index,
            "messages": [{"role": "user", "content": f"Tell me story number {index}."}]}


@dataclass(slots=True)
class Harness:
    """Engine + HTTP/3 front end + relay, all in this process."""

    server: Http3Server
    relay: Relay
    conditions: Conditions

    @property
    def relay_url(self) -> str:
        host, port = self.relay.listen_addr
        return f"https://{host}:{port}"

    @property
    def direct_url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"


@asynccontextmanager
async def harness(conditions: Conditions, workload: Workload, *, record: bool = False,
                  redundancy: str | int | None = None, page_origins: tuple[str, ...] = (),
                  wrap: Callable[[ASGIApp], ASGIApp] | None = None, padding: str = "off",
                  send_tick: float = 0.0, congestion_control: str | None = None) -> AsyncIterator[Harness]:
    """``record``: the relay keeps every packet (per-token timelines); ``redundancy``: the datagram senders'
    ``SenderConfig.redundancy`` (None: the default); ``page_origins``: pages that may open WebTransport sessions;
    ``wrap``: around the engine app (a bulk route beside it); ``padding``: the front end's ``--padding`` (its
    datagrams; the engine app is bare, so the reliable stream's SSE is not padded); ``send_tick``: its ``--send-tick``
    (datagrams only at multiples of it; the reliable stream is not paced, for the same reason);
    ``congestion_control``: the front end's (None: its default)."""
    app: ASGIApp = create_engine_app(EngineConfig(ttft=workload.ttft, tpot=workload.tpot,
                                                  max_tokens_limit=max(8192, workload.max_tokens)))
    if wrap is not None:
        app = wrap(app)
    options = FrontEndOptions(record_timings=True, sender_redundancy=redundancy, cors_origins=page_origins)
    if congestion_control is not None:
        options = replace(options, congestion_control=congestion_control)
    server = await start_http3_server(app, host="127.0.0.1", port=0,
                                      config=StreamConfig(padding=padding, send_tick=send_tick), options=options)
    try:
        up, down = conditions.paths()
        relay = await start_relay(RelayConfig(target=("127.0.0.1", server.port), upstream=up, downstream=down,
                                              record=record, bottleneck=conditions.bottleneck,
                                              precise_timers=True,
                                              outages=conditions.outages, seed=conditions.seed))
        try:
            yield Harness(server, relay, conditions)
        finally:
            await relay.close()
    finally:
        await server.close()


def client_for(scheme: str, url: str) -> Any:
    from eloquent_client import (
        EloquentClient,  # the client ships in the same distribution
    )

    if scheme == "stream":
        return EloquentClient(url, transport="h3-stream", verify=False, timeout=60.0)
    return EloquentClient(url, transport="eloquent", scheme=scheme, verify=False, timeout=60.0)


OnEvent = Callable[[str, int, str], None]


async def stream_once(h: Harness, client: Any, scheme: str, index: int, max_tokens: int,
                      on_text: OnEvent | None = None, delay: float = 0.0) -> StreamResult:
    """One streaming request; ``on_text(scheme, request, delta)`` sees the text as it renders."""
    result = StreamResult(scheme, index, "", [], [], "")
    if delay:
        await asyncio.sleep(delay)
    parts: list[str] = []
    try:
        async with client.stream("POST", "/v1/chat/completions", json=request_body(index, max_tokens)) as s:
            result.delivery = s.delivery
            async for event in s.events():
                result.rendered.append(event.rendered_at)
                delta = event.text
                result.content.append(bool(delta))
                if delta:
                    parts.append(delta)
                    if on_text is not None:
                        on_text(scheme, index, delta)
            if s.h3 is not None:
                result.fallback_events = s.h3.stats.fallback_events
            request_id = s.request_id
            result.request_id = request_id
    except Exception as exc:  # noqa: BLE001 - a failed stream is a result to report, not a crash
        result.error = f"{type(exc).__name__}: {exc}"
        return result
    result.text = "".join(parts)
    generated = h.server.generation_times(request_id) if request_id else None
    if generated is None or len(generated) != len(result.rendered):
        result.error = (f"server recorded {None if generated is None else len(generated)} events, "
                        f"client rendered {len(result.rendered)}")
        return result
    result.generated = generated
    return result


async def reference_texts(h: Harness, workload: Workload) -> list[str]:
    """What each request says without streaming, asked directly (not through the relay), all at once."""
    async with client_for("stream", h.direct_url) as client:
        async def one(i: int) -> str:
            r = await client.request("POST", "/v1/chat/completions",
                                     json=request_body(i, workload.max_tokens, stream=False))
            if r.status != 200:
                raise ConfigError(f"reference request failed: HTTP {r.status}: {r.content[:200]!r}")
            return str(r.json()["choices"][0]["message"]["content"])

        return list(await asyncio.gather(*(one(i) for i in range(workload.requests))))



@dataclass(slots=True)
class OutageRow:
    """``transport="auto"`` through a UDP outage: what it cost and whether the text came through whole."""

    label: str
    outage: Outage
    baseline: float
    """Seconds from the request to the last event without the outage (same request, same path)."""
    elapsed: float | None  # the same under the outage (None: the stream failed)
    text_intact: bool
    deliveries: list[str] = field(default_factory=list)
    resumes: int = 0
    error: str | None = None

    @property
    def time_lost(self) -> float | None:
        return None if self.elapsed is None else max(0.0, self.elapsed - self.baseline)


async def outage_rows(workload: Workload, outages: list[tuple[str, Outage]], *,
                      stream_idle_timeout: float = 3.0, h3_probe_timeout: float = 1.0,
                      handshake_allowance: float = 2.0) -> list[OutageRow]:
    """One ``auto`` stream per outage: the engine behind the SSE middleware on TCP (uvicorn) and HTTP/3, the relay
    on the UDP path (the outage counts from the request); a cut stream resumes over new QUIC or over SSE."""
    import time

    import httpx
    import uvicorn
    from eloquent_client import EloquentClient, PathMemory

    from eloquent_plugins.cli.bench.procs import free_port
    from eloquent_plugins.transports.sse.middleware import EloquentMiddleware

    app = EloquentMiddleware(create_engine_app(EngineConfig(ttft=workload.ttft, tpot=workload.tpot,
                                                            max_tokens_limit=max(8192, workload.max_tokens))))
    tcp = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning",
                                        lifespan="off"))
    tcp.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    serving = asyncio.get_running_loop().create_task(tcp.serve())
    server = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig())
    url = f"http://127.0.0.1:{tcp.config.port}"
    try:
        while not tcp.started:
            await asyncio.sleep(0.01)
        async with httpx.AsyncClient(timeout=60) as plain:
            answer = await plain.post(url + "/v1/chat/completions",
                                      json=request_body(0, workload.max_tokens, stream=False))
        reference = str(answer.json()["choices"][0]["message"]["content"])

        async def one(outage: Outage | None) -> tuple[float, str, list[str], int]:
            # The relay's clock starts now; the request goes out handshake_allowance later, so the outage counts
            # from the request whatever the handshake took (which is not what is measured).
            shifted = (Outage(outage.start + handshake_allowance, outage.duration),) if outage else ()
            relay = await start_relay(RelayConfig(target=("127.0.0.1", server.port), outages=shifted))
            try:
                async with EloquentClient(url, verify=False, h3_port=relay.listen_addr[1], path_memory=PathMemory(),
                                          stream_idle_timeout=stream_idle_timeout,
                                          h3_probe_timeout=h3_probe_timeout) as client:
                    await client.connection()
                    await asyncio.sleep(max(0.0, handshake_allowance - relay.elapsed()))
                    started = time.monotonic()
                    async with client.stream("POST", "/v1/chat/completions",
                                             json=request_body(0, workload.max_tokens)) as s:
                        text = await s.text()
                        return time.monotonic() - started, text, s.deliveries, s.resumes
            finally:
                await relay.close()

        baseline = (await one(None))[0]
        rows = []
        for label, outage in outages:
            try:
                elapsed, text, deliveries, resumes = await one(outage)
                rows.append(OutageRow(label, outage, baseline, elapsed, text == reference, deliveries, resumes))
            except Exception as exc:  # noqa: BLE001 - a failed stream is a result to report
                rows.append(OutageRow(label, outage, baseline, None, False, error=f"{type(exc).__name__}: {exc}"))
        return rows
    finally:
        await server.close()
        tcp.should_exit = True
        await serving


def format_table(result: E2EResult) -> str:
    rows = [("scheme", "stall ratio", "pooled", "stall/stream", "late p95", "late p99", "late max", "QoE",
             "done", "text")]
    for s in result.summaries().values():
        rows.append((LABELS[s.scheme], f"{s.stall_ratio_mean:.2%}", f"{s.stall_ratio_pooled:.2%}",
                     f"{s.stall_time_mean * 1000:.0f} ms", f"{s.lateness_p95 * 1000:.0f} ms",
                     f"{s.lateness_p99 * 1000:.0f} ms", f"{s.lateness_max * 1000:.0f} ms", f"{s.qoe_mean:.3f}",
                     f"{s.completed}/{s.streams}", "identical" if s.text_identical else "DIFFERENT"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    summary = result.summary()
    c = result.conditions
    lines.append("")
    lines.append(f"conditions: loss {c.loss:.0%} (mean burst {c.burst:g}), RTT {c.rtt * 1000:.0f} ms, "
                 f"{result.workload.requests} request{'s' if result.workload.requests != 1 else ''} x "
                 f"{result.workload.max_tokens} tokens, "
                 f"TPOT {result.workload.tpot * 1000:.0f} ms, seed {c.seed}; stall reference d = "
                 f"{result.min_delay * 1000:.1f} ms (one-way {c.one_way * 1000:.0f} ms + measured processing)")
    lines.append(f"Eloquent stall ratio vs retransmission: {pct(summary['stall_reduction_vs_retransmission'])} "
                 f"lower; vs duplication: {pct(summary['stall_reduction_vs_duplication'])} lower; "
                 f"text identical: {summary['text_identical']}")
    return "\n".join(lines)


def pct(x: float | None) -> str:
    """A reduction as a percentage, ``n/a`` when there is no baseline."""
    return "n/a" if x is None else f"{x:.1%}"


def add_link_arguments(parser: argparse.ArgumentParser) -> None:
    """The lossy link the relay emulates: the same options for ``bench e2e`` and ``eloquent demo``."""
    parser.add_argument("--loss", type=numbers.loss_rate, default=0.10,
                        help="loss rate each way (default: %(default)s)")
    parser.add_argument("--burst", type=numbers.burst, default=2.0,
                        help="mean loss burst in packets (default: %(default)s)")
    add_duration(parser, "--rtt", default=0.1, old_ms="--rtt-ms", help="round-trip time (default: %(default)s)")
