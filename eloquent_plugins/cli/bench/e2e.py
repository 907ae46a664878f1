"""``eloquent bench e2e``: the stall comparison end to end, over real QUIC through the lossy relay.

One built-in engine behind one HTTP/3 front end; the relay in front of it (delay, Gilbert-Elliott loss each
way); three clients, one connection each, asking the same server for the three schemes with the same
requests at the same time: Eloquent datagrams, the HTTP/3 reliable stream (retransmission) and duplicated
datagrams. The front end records when each event left the app; the client records when it became renderable
(same process, same monotonic clock); ``stall_metrics`` turns both into stall ratio and lateness. Every
scheme's text is checked against a non-streaming request for the same prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from eloquent_plugins.cli import numbers
from eloquent_plugins.core.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.sim.netem import LossSchedule, Outage, PathConfig
from eloquent_plugins.transports.http3 import FrontEndOptions, Http3Server, start_http3_server
from eloquent_plugins.sim.udp_relay import Relay, RelayConfig, start_relay
from eloquent_plugins.core.stall import StallReport, percentile, stall_metrics

SCHEMES = ("eloquent", "stream", "duplicate")
LABELS = {"eloquent": "Eloquent (datagrams)", "stream": "HTTP/3 stream (retransmission)",
          "duplicate": "duplication (datagrams x2)"}
MODEL = "eloquent-builtin"


@dataclass(frozen=True, slots=True)
class Conditions:
    loss: float = 0.10
    burst: float = 2.0
    rtt: float = 0.100
    jitter: float = 0.0
    loss_schedule: LossSchedule | None = None
    outages: tuple[Outage, ...] = ()
    seed: int = 1

    @property
    def one_way(self) -> float:
        return self.rtt / 2

    def path(self) -> PathConfig:
        return PathConfig(delay=self.one_way, jitter=self.jitter, loss=self.loss, burst=self.burst,
                          loss_schedule=self.loss_schedule)


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
async def harness(conditions: Conditions, workload: Workload) -> AsyncIterator[Harness]:
    app = create_engine_app(EngineConfig(ttft=workload.ttft, tpot=workload.tpot,
                                         max_tokens_limit=max(8192, workload.max_tokens)))
    server = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig(),
                                      options=FrontEndOptions(record_timings=True))
    try:
        path = conditions.path()
        relay = await start_relay(RelayConfig(target=("127.0.0.1", server.port), upstream=path, downstream=path,
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
                if delta:
                    parts.append(delta)
                    if on_text is not None:
                        on_text(scheme, index, delta)
            if s.h3 is not None:
                result.fallback_events = s.h3.stats.fallback_events
            request_id = s.request_id
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


async def run_e2e(conditions: Conditions, workload: Workload, *, schemes: tuple[str, ...] = SCHEMES,
                  on_text: OnEvent | None = None,
                  on_stream: Callable[[StreamResult], None] | None = None) -> E2EResult:
    started = time.monotonic()
    result = E2EResult(conditions, workload)
    async with harness(conditions, workload) as h:
        # Streams first: the relay's outage and loss schedules count from its start.
        clients = {scheme: client_for(scheme, h.relay_url) for scheme in schemes}
        try:
            await asyncio.gather(*(c.connection() for c in clients.values()))  # handshakes first
            for i in range(workload.requests):
                # Staggered by a fraction of a token time, so the schemes' tokens never need the (one) CPU
                # at the same instant: that would add the same queueing delay to every scheme's render times.
                stagger = workload.tpot / len(schemes)
                runs = await asyncio.gather(*(stream_once(h, clients[s], s, i, workload.max_tokens, on_text,
                                                          delay=k * stagger)
                                              for k, s in enumerate(schemes)))
                for run in runs:
                    result.streams.append(run)
                    if on_stream is not None:
                        on_stream(run)
        finally:
            for client in clients.values():
                await client.aclose()
        result.relay_stats = h.relay.stats
        result.references = await reference_texts(h, workload)
    result.elapsed = time.monotonic() - started
    result.score()
    return result


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

    def pct(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1%}"

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


def _pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def above_floor(result: E2EResult, floor: E2EResult) -> dict[str, float | None]:
    """Reductions of the stall ratio above each scheme's lossless floor (what the loss itself costs)."""
    s, f = result.summaries(), floor.summaries()

    def excess(scheme: str) -> float | None:
        if scheme not in s or scheme not in f:
            return None
        return max(0.0, s[scheme].stall_ratio_mean - f[scheme].stall_ratio_mean)

    def reduction(baseline: str) -> float | None:
        e, b = excess("eloquent"), excess(baseline)
        return None if e is None or not b else 1 - e / b

    return {"stall_reduction_vs_retransmission": reduction("stream"),
            "stall_reduction_vs_duplication": reduction("duplicate"),
            "floor": {k: v.stall_ratio_mean for k, v in f.items()}}


def add_link_arguments(parser: argparse.ArgumentParser) -> None:
    """The lossy link the relay emulates: the same options for ``bench e2e`` and ``eloquent demo``."""
    parser.add_argument("--loss", type=numbers.loss_rate, default=0.10,
                        help="loss rate each way (default: %(default)s)")
    parser.add_argument("--burst", type=numbers.burst, default=2.0,
                        help="mean loss burst in packets (default: %(default)s)")
    parser.add_argument("--rtt-ms", type=numbers.milliseconds, default=100.0,
                        help="round-trip time (default: %(default)s)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="3 requests x 80 tokens (well under a minute)")
    parser.add_argument("--requests", type=numbers.positive, default=None, help="requests per scheme (default: 8)")
    parser.add_argument("--tokens", type=numbers.positive, default=None, help="max tokens per request (default: 150)")
    add_link_arguments(parser)
    parser.add_argument("--jitter-ms", type=numbers.milliseconds, default=0.0,
                        help="mean extra one-way delay (default: 0)")
    parser.add_argument("--tpot-ms", type=numbers.milliseconds, default=30.0,
                        help="engine time per token (default: %(default)s)")
    parser.add_argument("--ttft-ms", type=numbers.milliseconds, default=200.0,
                        help="engine time to first token (default: %(default)s)")
    parser.add_argument("--seed", type=numbers.seed, default=1, help="relay loss seed (default: %(default)s)")
    parser.add_argument("--json", metavar="PATH", default=None, help="write conditions, per-scheme figures and "
                        "the summary as JSON")
    parser.add_argument("--calibrate", action="store_true", help="first run the same workload without loss and "
                        "report each scheme's stall floor (processing jitter on this machine) and the reductions "
                        "of the stall above it")


def _config(args: argparse.Namespace) -> tuple[Conditions, Workload]:
    requests = args.requests if args.requests is not None else (3 if args.quick else 8)
    tokens = args.tokens if args.tokens is not None else (80 if args.quick else 150)
    conditions = Conditions(loss=args.loss, burst=args.burst, rtt=args.rtt_ms / 1000, jitter=args.jitter_ms / 1000,
                            seed=args.seed)
    conditions.path()  # validates loss/burst
    return conditions, Workload(requests=requests, max_tokens=tokens, ttft=args.ttft_ms / 1000,
                                tpot=args.tpot_ms / 1000)


def run(args: argparse.Namespace) -> int:
    conditions, workload = _config(args)
    done = [0]
    total = workload.requests * len(SCHEMES)

    def progress(stream: StreamResult) -> None:
        done[0] += 1
        sys.stderr.write(f"\re2e: {done[0]}/{total} streams")
        if done[0] == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    floor: E2EResult | None = None
    if args.calibrate:
        lossless = replace(conditions, loss=0.0)
        floor = asyncio.run(run_e2e(lossless, workload))
        print("lossless calibration run (the stall floor of this machine and stack):")
        print(format_table(floor) + "\n")
    result = asyncio.run(run_e2e(conditions, workload, on_stream=progress))
    print(format_table(result))
    if floor is not None:
        corrected = above_floor(result, floor)
        print(f"stall above the lossless floor: Eloquent vs retransmission "
              f"{_pct(corrected['stall_reduction_vs_retransmission'])} lower, vs duplication "
              f"{_pct(corrected['stall_reduction_vs_duplication'])} lower")
    for stream in result.streams:
        if stream.error:
            print(f"  {stream.scheme} request {stream.request}: {stream.error}")
    if args.json:
        data = result.as_json()
        if floor is not None:
            data["calibration"] = {"schemes": {k: asdict(v) for k, v in floor.summaries().items()},
                                   "above_floor": above_floor(result, floor)}
        with open(args.json, "w", encoding="utf-8") as fp:
            json.dump(data, fp, indent=2)
    summary = result.summary()
    return 0 if summary["text_identical"] and summary["all_completed"] else 1
