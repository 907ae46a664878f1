"""``eloquent bench leak``: what an observer of the encrypted connection learns from write sizes and times (issue 29).

The observer sees only what TLS or QUIC leaves visible: the size and time of each SSE write (the ASGI body
messages the real ``EloquentMiddleware`` hands the server for the built-in engine's answers, in process) or of each
Eloquent datagram (the real sender in the simulator, 10% loss by default). Per ``--padding`` mode it tries

(a) to recover each token's byte length: a table from what it sees (write size; datagram size and the size change
    since the previous datagram) to the token length most often seen with it in the training runs;
(b) to tell which of ``--answers`` known answers was streamed: 1-nearest-neighbour over three feature sets (the
    size sequence, the histogram of sizes; the sequence of gaps between writes), leave-one-run-out over ``--runs``
    runs of each answer; the better of the two size attacks and the timing attack are reported, against chance
    ``1/answers``.

Every answer has ``--tokens`` tokens, so the number of writes does not tell them apart (it does in real life:
padding does not hide an answer's length). Also per mode: bytes against ``off`` (payload, and on the wire with a
per-write TLS+TCP or QUIC+UDP overhead), stall ratio in the simulator at ``--loss`` (TCP with the padded write
sizes for SSE, the Eloquent sender with padding for datagrams), CPU per event, and with ``--send-tick`` one more
row per path paced to that tick (``TICK_MODES``: SSE with ``constant``, datagrams with ``bucket``) with the
latency it adds (from each token's generation to the first write or datagram that carries it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Callable
from typing import Any

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.bench.leak_cost import TLS_RECORD, padding_cpu, sse_stall, summarize
from eloquent_plugins.cli.bench.leak_paths import Source, builtin_source, observe_datagrams, observe_sse
from eloquent_plugins.cli.flags import add_progress
from eloquent_plugins.core.padding import DATAGRAM_FLOOR, DATAGRAM_GROWTH, MODES, SSE_GROWTH
from eloquent_plugins.sim.link import QUIC_DATAGRAM_HEADER, TCP_HEADER
from eloquent_plugins.sim.scenario import Scenario

TICK_MODES = {"sse": "constant", "datagram": "bucket"}
"""The padding of each path's ``--send-tick`` row: the mode that path would run with timing hidden too (SSE
``constant`` costs the built-in engine's chunks no more than ``bucket``; datagram ``constant`` costs 2-4x the bytes
and stall, docs/results/padding.md)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--answers", type=numbers.positive, default=20, help="known answers to tell apart (20)")
    parser.add_argument("--runs", type=numbers.positive, default=5, help="runs of each answer (5; >= 2)")
    parser.add_argument("--tokens", type=numbers.positive, default=40, help="tokens per answer (40)")
    parser.add_argument("--modes", default=",".join(MODES), help="padding modes, comma-separated (off,bucket,constant)")
    parser.add_argument("--paths", default="sse,datagram", help="sse, datagram or both (sse,datagram)")
    parser.add_argument("--loss", type=numbers.loss_rate, default=0.10, help="simulated loss each direction (0.10)")
    parser.add_argument("--rtt", type=numbers.seconds, default=0.06, help="simulated round trip, seconds (0.06)")
    parser.add_argument("--tpot", type=numbers.seconds, default=0.03, help="simulated seconds per token (0.03)")
    parser.add_argument("--sse-tpot", type=numbers.seconds, default=0.004,
                        help="the in-process engine's seconds per token for the SSE path (0.004)")
    parser.add_argument("--engine-jitter", type=numbers.fraction, default=0.3,
                        help="the in-process engine's tpot jitter (0.3); it is seeded by the prompt, so each answer "
                        "keeps its own timing from run to run: a stand-in for timing that depends on the content")
    parser.add_argument("--sim-times", choices=("engine", "drawn"), default="engine",
                        help="the built-in answers' token times in the simulator: the engine's own, recorded in "
                        "process at --tpot (each answer's seeded rhythm, as on the SSE path; default), or drawn "
                        "afresh each run (timing says nothing about the answer)")
    parser.add_argument("--send-tick", type=numbers.seconds, default=0.0,
                        help="also run each path with this --send-tick (SSE with --padding constant, datagrams "
                        "with bucket; 0: skip)")
    parser.add_argument("--datagram-floor", type=numbers.positive, default=DATAGRAM_FLOOR,
                        help=f"smallest datagram class of bucket padding ({DATAGRAM_FLOOR})")
    parser.add_argument("--datagram-growth", type=numbers.growth, default=DATAGRAM_GROWTH,
                        help=f"ratio between datagram classes of bucket padding ({DATAGRAM_GROWTH:g})")
    parser.add_argument("--sse-growth", type=numbers.growth, default=SSE_GROWTH,
                        help=f"ratio between SSE classes of bucket padding ({SSE_GROWTH:g})")
    parser.add_argument("--concurrency", type=numbers.positive, default=8, help="SSE streams at once (8)")
    parser.add_argument("--seed", type=numbers.seed, default=29)
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--vllm", metavar="MODEL", help="also record --answers x --runs answers of a real vLLM "
                        "server on MODEL (started with --vllm-python) and run the attack on them")
    parser.add_argument("--vllm-python", metavar="PATH", help="python of the vLLM venv for --vllm (default "
                        "$ELOQUENT_VLLM_VENV/bin/python, else this python)")
    parser.add_argument("--vllm-args", default="", help="extra vLLM flags, one string (e.g. '--max-model-len 4096')")
    parser.add_argument("--vllm-temperature", type=numbers.fraction, default=0.0,
                        help="sampling temperature of the recorded vLLM answers (0: each run the same text, so the "
                        "runs differ in timing only); above 0 run k uses seed k")
    parser.add_argument("--vllm-answers", metavar="PATH", help="with --vllm: also write the recorded answers here; "
                        "without it: replay the answers recorded here (no vLLM needed)")
    parser.add_argument("--vllm-startup-timeout", type=numbers.positive_seconds, default=900.0, help=argparse.SUPPRESS)
    parser.add_argument("--no-builtin", action="store_true", help="skip the built-in engine's answers")
    add_progress(parser)



def run(args: argparse.Namespace) -> int:
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"--modes: unknown padding mode {m!r} (choose from {', '.join(MODES)})")
    if args.vllm_answers and not args.vllm and not os.path.exists(args.vllm_answers):
        raise SystemExit(f"--vllm-answers: no recording at {args.vllm_answers} (record one with --vllm MODEL)")
    if args.runs < 2:
        raise SystemExit("--runs must be at least 2 (the attacker trains on the other runs)")
    show: Callable[[str], None] = (lambda line: print(line, flush=True)) if args.progress else (lambda line: None)
    scenario = Scenario(loss=args.loss, rtt_ms=args.rtt * 1000, tpot_ms=args.tpot * 1000, tokens=args.tokens)
    sources = [] if args.no_builtin else [
        builtin_source(args.answers, args.tokens, args.sse_tpot, args.engine_jitter, args.tpot, args.runs,
                       args.concurrency, args.sim_times == "drawn")]
    if args.vllm or args.vllm_answers:
        from eloquent_plugins.cli.bench.leak_vllm import vllm_source

        sources.append(vllm_source(args, show))
    rows: list[dict[str, Any]] = []
    for source in sources:
        rows += measure(source, args, modes, paths, scenario, show)
    print_table(rows, args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fp:
            json.dump({"answers": args.answers, "runs": args.runs, "tokens": args.tokens, "loss": args.loss,
                       "variants": rows}, fp, indent=2)
    return 0


def measure(source: Source, args: argparse.Namespace, modes: list[str], paths: list[str], scenario: Scenario,
            show: Callable[[str], None]) -> list[dict[str, Any]]:
    """One row per path and mode for one answer source."""
    rows: list[dict[str, Any]] = []
    plain: dict[str, int] = {}
    answers = len(source.prompts)
    frame = b'id: tok:12\ndata: {"id":"chatcmpl-x","object":"chat.completion.chunk","choices":[{"delta":' \
            b'{"content":" word"}}]}\n\n'
    datagram = bytes(40)
    def variants(path: str) -> list[tuple[str, float]]:
        return [(m, 0.0) for m in modes] + ([(TICK_MODES[path], args.send_tick)] if args.send_tick else [])

    if "sse" in paths:
        for mode, tick in variants("sse"):
            observed, cpu, padding = observe_sse(mode, tick, source, args.runs, args.tokens, args.concurrency, show,
                                                 args.sse_growth)
            stall = sse_stall(observed, scenario, source, args.seed)
            raw = sum(sum(o.sizes) for o in observed) - padding
            if mode == "off":
                plain["sse"] = sum(len(o.sizes) for o in observed)
            row = summarize("sse", mode + (f"+tick {tick * 1000:g}ms" if tick else ""), observed, args.runs,
                            answers, args.tokens, cpu, stall, raw, TLS_RECORD + TCP_HEADER, plain.get("sse"))
            row["padding_ns_per_event"] = round(padding_cpu(mode, frame, datagram)[0])
            rows.append(row)
    if "datagram" in paths:
        for mode, tick in variants("datagram"):
            observed, cpu = observe_datagrams(mode, source, args.runs, scenario, args.seed, show,
                                              args.datagram_floor, args.datagram_growth, tick)
            stall = statistics.fmean(o.stall for o in observed)
            raw = sum(o.raw_bytes for o in observed)
            if mode == "off" and not tick:
                plain["datagram"] = raw
            row = summarize("datagram", mode + (f"+tick {tick * 1000:g}ms" if tick else ""), observed, args.runs,
                            answers, args.tokens, cpu, stall, plain.get("datagram", raw), QUIC_DATAGRAM_HEADER, None)
            row["padding_ns_per_event"] = round(padding_cpu(mode, frame, datagram)[1])
            rows.append(row)
    for row in rows:
        row["source"] = source.name
    return rows


def print_table(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    print(f"bench leak: {args.runs} runs of each answer, {args.tokens} tokens; simulated loss {args.loss:g}, "
          f"rtt {args.rtt * 1000:g} ms")
    head = (f"{'path':<9}{'mode':<22}{'len rec':>8}{'(base)':>8}{'id size':>8}{'xch':>6}{'id time':>8}{'xch':>6}"
            f"{'bytes':>7}{'wire':>7}"
            f"{'sizes':>6}{'stall':>8}{'cpu us/ev':>10}{'pad ns':>8}{'lat ms':>8}{'p95':>7}")
    print(head)
    source = None
    for r in rows:
        if r["source"] != source:
            source = r["source"]
            print(f"-- answers: {source}: {round(1 / r['chance'])} of them, chance {r['chance']:.3f}")
        lat, p95 = r["latency_ms_mean"], r["latency_ms_p95"]
        print(f"{r['path']:<9}{r['mode']:<22}{r['token_length_recovery']:>8.3f}{r['token_length_baseline']:>8.3f}"
              f"{r['identification_sizes']:>8.3f}{r['identification_sizes_x_chance']:>6.1f}"
              f"{r['identification_timed']:>8.3f}{r['identification_timed_x_chance']:>6.1f}{r['bytes_ratio']:>7.2f}"
              f"{r['wire_bytes_ratio']:>7.2f}{r['sizes_seen']:>6}{r['stall_ratio']:>8.4f}"
              f"{r['cpu_us_per_event']:>10.1f}{r['padding_ns_per_event']:>8}{'' if lat is None else f'{lat:.2f}':>8}"
              f"{'' if p95 is None else f'{p95:.2f}':>7}")
