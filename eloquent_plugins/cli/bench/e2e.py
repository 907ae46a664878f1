"""``eloquent bench e2e``: the stall comparison end to end, over real QUIC through the lossy relay.

One built-in engine behind one HTTP/3 front end; the relay in front of it (delay, Gilbert-Elliott loss each
way); three clients, one connection each, asking the same server for the three schemes with the same
requests at the same time: Eloquent datagrams, the HTTP/3 reliable stream (retransmission) and duplicated
datagrams. The front end records when each event left the app; the client records when it became renderable
(same process, same monotonic clock); ``stall_metrics`` turns both into stall ratio and lateness. Every
scheme's text is checked against a non-streaming request for the same prompt. The harness itself (shared with
``eloquent demo`` and ``eloquent chat``) is ``eloquent_plugins.cli.harness``.

Then the client's ``transport="auto"`` under a UDP outage, as rows of their own: one stream through an outage that
ends, one through UDP that never comes back (the stream resumes over SSE), each with the time it lost against the
same stream uncut and whether its text is intact (``--outage``, ``--no-outage``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, replace

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.bench import timeline
from eloquent_plugins.cli.flags import add_duration, add_progress
from eloquent_plugins.core.padding import MODES
from eloquent_plugins.sim.relay_record import Bottleneck
from eloquent_plugins.cli.harness import (
    SCHEMES,
    Conditions,
    E2EResult,
    OnEvent,
    OutageRow,
    StreamResult,
    Workload,
    add_link_arguments,
    client_for,
    format_table,
    harness,
    outage_rows,
    pct,
    reference_texts,
    stagger_offsets,
    stream_once,
)
from eloquent_plugins.sim.netem import Outage, parse_outage


async def run_e2e(conditions: Conditions, workload: Workload, *, schemes: tuple[str, ...] = SCHEMES,
                  on_text: OnEvent | None = None,
                  on_stream: Callable[[StreamResult], None] | None = None, record: bool = False,
                  redundancy: str | None = None, padding: str = "off", send_tick: float = 0.0) -> E2EResult:
    """``record``: also build per-token timelines and their simulator replay (``cli/bench/timeline.py``);
    ``redundancy``: the datagram senders' ``SenderConfig.redundancy``; ``padding``, ``send_tick``: the front end's."""
    started = time.monotonic()
    result = E2EResult(conditions, workload)
    async with harness(conditions, workload, record=record, redundancy=redundancy, padding=padding,
                       send_tick=send_tick) as h:
        # Streams first: the relay's outage and loss schedules count from its start.
        clients = {scheme: client_for(scheme, h.relay_url) for scheme in schemes}
        try:
            await asyncio.gather(*(c.connection() for c in clients.values()))  # handshakes first
            # Staggered so the schemes' tokens never need the (one) CPU at the same instant, at the server, the
            # client or the ack's return: that would add one scheme's processing to another's render times.
            offsets = stagger_offsets(len(schemes), workload.tpot, conditions.one_way)
            for i in range(workload.requests):
                runs = await asyncio.gather(*(stream_once(h, clients[s], s, i, workload.max_tokens, on_text,
                                                          delay=offsets[k])
                                              for k, s in enumerate(schemes)))
                for run in runs:
                    result.streams.append(run)
                    if on_stream is not None:
                        on_stream(run)
        finally:
            for client in clients.values():
                await client.aclose()
        result.relay_stats = h.relay.stats
        if record:
            result.timelines = timeline.collect(h, result.streams, conditions.rtt)
            result.flow_loss = timeline.flow_loss(h, result.streams)
        result.references = await reference_texts(h, workload)
    result.elapsed = time.monotonic() - started
    result.score()
    return result


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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="3 requests x 80 tokens (well under a minute)")
    parser.add_argument("--requests", type=numbers.positive, default=None, help="requests per scheme (default: 8)")
    parser.add_argument("--tokens", type=numbers.positive, default=None, help="max tokens per request (default: 150)")
    add_link_arguments(parser)
    add_duration(parser, "--jitter", default=0.0, old_ms="--jitter-ms", help="mean extra one-way delay (default: 0)")
    add_duration(parser, "--tpot", default=0.03, old_ms="--tpot-ms", help="engine seconds per token (default: "
                 "%(default)s)")
    add_duration(parser, "--ttft", default=0.2, old_ms="--ttft-ms", help="engine seconds to the first token "
                 "(default: %(default)s)")
    parser.add_argument("--seed", type=numbers.seed, default=1, help="relay loss seed (default: %(default)s)")
    parser.add_argument("--json", metavar="PATH", default=None, help="write conditions, per-scheme figures and "
                        "the summary as JSON")
    parser.add_argument("--outage", default=None, metavar="START:DURATION",
                        help="the auto-transport rows' UDP outage, seconds from the request (default: a third into "
                        "the stream, 3 s long; a second row keeps UDP down from the same start)")
    parser.add_argument("--no-outage", action="store_true", help="skip the auto-transport outage rows")
    parser.add_argument("--stream-idle-timeout", type=numbers.positive_seconds, default=3.0, metavar="SECONDS",
                        help="the auto client's stream-idle timeout in the outage rows (default: %(default)s)")
    parser.add_argument("--calibrate", action="store_true", help="first run the same workload without loss and "
                        "report each scheme's stall floor (processing jitter on this machine) and the reductions "
                        "of the stall above it")
    parser.add_argument("--bandwidth-kbps", type=numbers.positive, default=None,
                        help="a bottleneck every client's server -> client packets share (kbit/s), so loss also "
                        "comes from queue overflow (default: none)")
    parser.add_argument("--queue-kb", type=numbers.positive, default=16,
                        help="the bottleneck's drop-tail queue in KiB (default: %(default)s)")
    parser.add_argument("--redundancy", choices=("off", "adaptive"), default=None,
                        help="the datagram senders' SenderConfig.redundancy (default: the sender's default)")
    parser.add_argument("--padding", choices=MODES, default="off",
                        help="the front end's datagram padding (off; docs/results/padding.md)")
    parser.add_argument("--send-tick", type=numbers.seconds, default=0.0, metavar="SECONDS",
                        help="the front end's --send-tick: datagrams only at multiples of it (0: off; "
                        "docs/results/padding.md)")
    parser.add_argument("--trace", default=None, metavar="NAME",
                        help="a cellular trace pair of shared/traces/mahimahi (ELOQUENT_TRACES_DIR) instead of "
                        "random loss: the relay drains each direction at the trace's opportunities; each scheme "
                        "and each request alone on its own relay and queue, as in bench sim --links traces")
    parser.add_argument("--cross", action="store_true",
                        help="with --trace: a bulk HTTP/3 download through the same relay and queue")
    parser.add_argument("--one-path", action="store_true",
                        help="with --trace: a scheme's requests one after another through one relay, queue and QUIC "
                        "connection (default: each request on a fresh one, like the simulator's streams)")
    parser.add_argument("--shared-queue", action="store_true",
                        help="with --trace: the schemes at once through one relay, one queue per direction and one "
                        "bulk download shared by all, requests one after another (default: each scheme alone, "
                        "like the simulator)")
    parser.add_argument("--scheme", action="append", choices=SCHEMES, default=None,
                        help="with --trace: run only this scheme (repeat for several; default: all three)")
    parser.add_argument("--queue-packets", type=numbers.positive, default=100,
                        help="with --trace: the drop-tail queue in packets, each direction (default: %(default)s)")
    parser.add_argument("--no-cross-baseline", action="store_true",
                        help="with --cross: skip the bulk download's runs alone (its throughput baseline)")
    parser.add_argument("--browser", nargs="?", const="all", default=None, choices=("all", "chromium", "firefox"),
                        help="add a row per browser engine (all: both; default when given alone): headless Chromium "
                        "(Debian's chromium, DevTools) and Firefox ESR (firefox-esr, WebDriver BiDi) running /chat "
                        "over WebTransport; needs websocket-client")
    timeline.add_arguments(parser)
    add_progress(parser)


def _config(args: argparse.Namespace) -> tuple[Conditions, Workload]:
    requests = args.requests if args.requests is not None else (3 if args.quick else 8)
    tokens = args.tokens if args.tokens is not None else (80 if args.quick else 150)
    bottleneck = (Bottleneck(args.bandwidth_kbps * 1000, args.queue_kb * 1024)
                  if getattr(args, "bandwidth_kbps", None) else None)
    conditions = Conditions(loss=args.loss, burst=args.burst, rtt=args.rtt, jitter=args.jitter,
                            seed=args.seed, bottleneck=bottleneck)
    conditions.path()  # validates loss/burst
    return conditions, Workload(requests=requests, max_tokens=tokens, ttft=args.ttft,
                                tpot=args.tpot)


def run(args: argparse.Namespace) -> int:
    conditions, workload = _config(args)
    if args.trace:
        from eloquent_plugins.cli.bench.e2e_links import run_trace

        return run_trace(args, workload)
    done = [0]
    total = workload.requests * len(SCHEMES)

    def progress(stream: StreamResult) -> None:
        done[0] += 1
        if not args.progress:
            return
        sys.stderr.write(f"\re2e: {done[0]}/{total} streams")
        if done[0] == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    floor: E2EResult | None = None
    record = bool(args.timeline or args.plot or conditions.bottleneck)
    if args.calibrate:
        lossless = replace(conditions, loss=0.0)
        floor = asyncio.run(run_e2e(lossless, workload, redundancy=args.redundancy, record=record))
        print("lossless calibration run (the stall floor of this machine and stack):")
        print(format_table(floor) + "\n")
    result = asyncio.run(run_e2e(conditions, workload, on_stream=progress, record=record,
                                 redundancy=args.redundancy, padding=args.padding, send_tick=args.send_tick))
    print(format_table(result))
    if args.browser:
        from eloquent_plugins.cli.bench.browser import ENGINES, browser_table_row

        for engine in ENGINES if args.browser == "all" else (args.browser,):
            print("\n" + browser_table_row(result, engine))
    timeline.report(args, result, floor)
    if floor is not None:
        corrected = above_floor(result, floor)
        print(f"stall above the lossless floor: Eloquent vs retransmission "
              f"{pct(corrected['stall_reduction_vs_retransmission'])} lower, vs duplication "
              f"{pct(corrected['stall_reduction_vs_duplication'])} lower")
    for stream in result.streams:
        if stream.error:
            print(f"  {stream.scheme} request {stream.request}: {stream.error}")
    rows: list[OutageRow] = []
    if not args.no_outage:
        rows = asyncio.run(outage_rows(workload, _outages(args, workload),
                                       stream_idle_timeout=args.stream_idle_timeout))
        print("\n" + format_outage_rows(rows))
    if args.json:
        data = result.as_json()
        if floor is not None:
            data["calibration"] = {"schemes": {k: asdict(v) for k, v in floor.summaries().items()},
                                   "above_floor": above_floor(result, floor)}
        data["auto_outage"] = [{"label": r.label, "outage": asdict(r.outage), "baseline_s": r.baseline,
                                "elapsed_s": r.elapsed, "time_lost_s": r.time_lost, "text_intact": r.text_intact,
                                "deliveries": r.deliveries, "resumes": r.resumes, "error": r.error} for r in rows]
        with open(args.json, "w", encoding="utf-8") as fp:
            json.dump(data, fp, indent=2)
    summary = result.summary()
    intact = all(r.text_intact for r in rows)
    return 0 if summary["text_identical"] and summary["all_completed"] and intact else 1


def _outages(args: argparse.Namespace, workload: Workload) -> list[tuple[str, Outage]]:
    if args.outage is not None:
        chosen = parse_outage(args.outage)
    else:
        chosen = Outage(round(workload.ttft + workload.max_tokens * workload.tpot / 3, 3), 3.0)
    return [(f"UDP down {chosen.start:g}-{chosen.start + chosen.duration:g} s", chosen),
            (f"UDP gone from {chosen.start:g} s", Outage(chosen.start, 1e6))]


def format_outage_rows(rows: list[OutageRow]) -> str:
    lines = ["transport=auto under a UDP outage (relay drops everything both ways):"]
    for row in rows:
        lost = "failed" if row.time_lost is None else f"{row.time_lost:.2f} s lost"
        how = " then ".join(row.deliveries) or "-"
        lines.append(f"  {row.label}: {lost} (uncut {row.baseline:.2f} s), text "
                     f"{'intact' if row.text_intact else 'NOT intact'}, via {how}, {row.resumes} resume(s)"
                     + (f"; {row.error}" if row.error else ""))
    return "\n".join(lines)

