"""``eloquent bench sim``: stall ratio of Eloquent vs retransmission, duplication and the oracle, simulated.

Runs the standard matrix (or ``--quick``, or ``--scenario`` conditions), prints a table, and optionally writes
the JSON (``--json``) and a PNG (``--plot``). Deterministic: the same ``--seed`` gives the same numbers, whatever
``--jobs`` is.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from concurrent.futures import ProcessPoolExecutor

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.flags import add_plot, add_progress
from eloquent_plugins.cli.optional import needs_extra
from eloquent_plugins.core.stall import DEFAULT_READING_PACE
from eloquent_plugins.sim.links import CROSS_FLOWS, LINK_RTT_MS
from eloquent_plugins.sim.quic_window import WINDOWS
from eloquent_plugins.sim.timeline import DECODES
from eloquent_plugins.sim.matrix import Plan, custom_plan, quick_plan, standard_plan, with_tokens
from eloquent_plugins.sim.report import ScenarioResult, format_table, plot, summarize_scenario, write_json
from eloquent_plugins.sim.run import ALL_SCHEMES, ELOQUENT_ADAPTIVE, ELOQUENT_X2, RACK_TLP, SCHEMES, StreamRun, simulate_stream
from eloquent_plugins.sim.scenario import Scenario, parse_scenario

Task = tuple[int, Scenario, int, int, tuple[str, ...]]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", action="append", default=[], metavar="SPEC",
                        help='custom conditions instead of the matrix, e.g. "loss=0.1,burst=3,rtt=100,jitter=10,'
                        'tpot=30" (keys: loss, burst, rtt ms, jitter ms, tpot ms, bw kbit/s, tokens, streams, '
                        'trace FILE, k); repeatable')
    parser.add_argument("--quick", action="store_true", help="a reduced matrix that finishes in seconds")
    parser.add_argument("--seed", type=numbers.seed, default=1, help="base seed (default: %(default)s)")
    parser.add_argument("--seeds", type=numbers.positive, default=3, help="seeds per --scenario (default: %(default)s)")
    parser.add_argument("--tokens", type=numbers.positive, default=None, help="override tokens per stream")
    parser.add_argument("--streams", type=numbers.positive, default=None, help="override streams per scenario and seed")
    parser.add_argument("--rack-tlp", action="store_true",
                        help="also run the TCP baseline with Linux's RACK-TLP loss recovery (a sensitivity check; "
                        "the summary's figures stay against the issue's baseline)")
    parser.add_argument("--eloquent-x2", action="store_true",
                        help="also run Eloquent with every datagram sent twice (a sensitivity check)")
    parser.add_argument("--eloquent-adaptive", action="store_true",
                        help='also run Eloquent with SenderConfig(redundancy="adaptive"): runs sent twice while '
                        "the sender sees loss")
    parser.add_argument("--reading-pace", type=numbers.positive_seconds, default=DEFAULT_READING_PACE,
                        metavar="SECONDS",
                        help="seconds per token the QoE reader digests (Andes; default: %(default)s)")
    parser.add_argument("--jobs", type=numbers.positive, default=min(2, os.cpu_count() or 1),
                        help="worker processes (default: 2, 1 on a one-CPU machine)")
    parser.add_argument("--json", metavar="PATH", default=None, help="write results and summary as JSON")
    add_plot(parser, "write a PNG of stall ratio per scheme")
    add_progress(parser)
    parser.add_argument("--links", choices=("traces",), default=None,
                        help="instead of the loss matrix: the four schemes on the cellular traces of "
                        "shared/traces/mahimahi (ELOQUENT_TRACES_DIR), with and without a bulk download")
    parser.add_argument("--trace", action="append", default=[], metavar="NAME",
                        help="with --links: only these traces (repeatable; default: all five)")
    parser.add_argument("--cross", type=numbers.count, choices=(0, 1), default=None,
                        help="with --links: only without (0) or with (1) the bulk download (default: both)")
    parser.add_argument("--cross-flow", choices=CROSS_FLOWS, default="tcp",
                        help="with --links: the bulk download is the simulator's CUBIC TCP (tcp, the default) or "
                        "aioquic's QUIC with CUBIC and its pacer (quic: the flow bench e2e --trace --cross runs)")
    parser.add_argument("--decode", choices=DECODES, default="jittered",
                        help="the tokens' generation times: jittered (log-normal jitter and long gaps, the default) "
                        "or steady (every tpot, as bench e2e's engine streams them)")
    parser.add_argument("--against", metavar="E2E_JSON", default=None,
                        help="with --links: a bench e2e --trace --json file; its Eloquent network-only stall beside "
                        "the simulator's on the same streams, with a paired bootstrap 95%% interval of their ratio")
    parser.add_argument("--link-rtt", type=numbers.positive_milliseconds, default=LINK_RTT_MS, metavar="MS",
                        help="with --links: the links' base round trip before the queues, ms (default: %(default)g, "
                        "as bench e2e --trace --rtt 0.06)")
    parser.add_argument("--queue-packets", type=numbers.positive, default=100,
                        help="with --links: the drop-tail queue in packets, each direction (default: %(default)s)")
    parser.add_argument("--codel", action="store_true", help="with --links: CoDel on the queues")
    parser.add_argument("--recarry-limit", type=numbers.count, default=0, metavar="BYTES",
                        help="with --links: the Eloquent schemes' SenderConfig.recarry_limit (0: none, the default)")
    parser.add_argument("--recarry-bounds", action="store_true",
                        help="with --links: also Eloquent without re-carrying (eloquent-new-only) and the bound of one "
                        "packet per token (once): what re-carrying costs the cross flow")
    parser.add_argument("--eloquent-window", choices=WINDOWS, default=None,
                        help="the Eloquent schemes' QUIC congestion window: aioquic's reno or cubic, as the HTTP/3 "
                        "front end holds datagrams, or none (sent at once); default: cubic with --links (the front "
                        "end's on a trace), none for the loss matrix (docs/results/sim.md)")
    parser.add_argument("--plot-stream", type=numbers.count, default=0, metavar="N",
                        help="with --links --plot: which stream of the first trace (with cross traffic) to plot")
    parser.add_argument("--timeline", metavar="PATH", default=None,
                        help="write the per-token timeline of the first stream of the first scenario (Eloquent: "
                        "generated, every datagram and its fate, rendered) as JSON")


def build_plan(args: argparse.Namespace) -> Plan:
    if args.scenario:
        plan = custom_plan([parse_scenario(s) for s in args.scenario], args.seed, args.seeds)
    elif args.quick:
        plan = quick_plan(args.seed)
    else:
        plan = standard_plan(args.seed)
    plan = with_tokens(plan, args.tokens, args.streams)
    if args.eloquent_window is not None:
        plan = replace(plan, scenarios=tuple(replace(s, window=args.eloquent_window) for s in plan.scenarios))
    if args.decode != "jittered":
        plan = replace(plan, scenarios=tuple(replace(s, decode=args.decode) for s in plan.scenarios))
    for scenario in plan.scenarios:
        scenario.load_trace()  # a bad trace fails now, with its line number, not in a worker
    return plan


def _run_task(task: Task) -> tuple[int, dict[str, StreamRun]]:
    index, scenario, seed, stream, schemes = task
    return index, simulate_stream(scenario, seed, stream, scenario.load_trace(), schemes)


def _tasks(plan: Plan, schemes: tuple[str, ...] = SCHEMES) -> list[Task]:
    return [(i, s, seed, stream, schemes) for i, s in enumerate(plan.scenarios) for seed in plan.seeds
            for stream in range(s.streams)]


def _progress(done: int, total: int, started: float, enabled: bool) -> None:
    if not enabled:
        return
    width = 30
    filled = int(width * done / total)
    sys.stderr.write(f"\rsim [{'#' * filled}{'.' * (width - filled)}] {done}/{total} streams "
                     f"{time.monotonic() - started:5.1f}s")
    if done == total:
        sys.stderr.write("\n")
    sys.stderr.flush()


def execute(plan: Plan, jobs: int = 1, progress: bool = False, pace: float = DEFAULT_READING_PACE,
            schemes: tuple[str, ...] = SCHEMES) -> list[ScenarioResult]:
    tasks = _tasks(plan, schemes)
    collected: dict[int, list[tuple[int, int, dict[str, StreamRun]]]] = {i: [] for i in range(len(plan.scenarios))}
    started = time.monotonic()
    _progress(0, len(tasks), started, progress)

    def results() -> Iterator[tuple[Task, tuple[int, dict[str, StreamRun]]]]:
        if jobs <= 1:
            for task in tasks:
                yield task, _run_task(task)
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                yield from zip(tasks, pool.map(_run_task, tasks, chunksize=4))

    for done, (task, (index, runs)) in enumerate(results(), 1):
        collected[index].append((task[2], task[3], runs))
        _progress(done, len(tasks), started, progress)
    out = []
    for i, scenario in enumerate(plan.scenarios):
        ordered = [runs for _, _, runs in sorted(collected[i], key=lambda x: (x[0], x[1]))]
        out.append(summarize_scenario(scenario, ordered, pace))
    return out


def run(args: argparse.Namespace) -> int:
    if args.plot:  # before the run, not after it
        with needs_extra("bench sim --plot"):
            import matplotlib  # noqa: F401
    if args.links:
        from eloquent_plugins.cli.bench.sim_links import run_links

        return run_links(args)
    plan = build_plan(args)
    extra = {RACK_TLP} if args.rack_tlp else set()
    extra |= {ELOQUENT_X2} if args.eloquent_x2 else set()
    extra |= {ELOQUENT_ADAPTIVE} if args.eloquent_adaptive else set()
    schemes = tuple(s for s in ALL_SCHEMES if s in SCHEMES or s in extra)
    results = execute(plan, args.jobs, progress=args.progress, pace=args.reading_pace, schemes=schemes)
    print(format_table(results))
    meta = {"plan": plan.name, "seeds": list(plan.seeds), "argv": sys.argv[1:], "reading_pace": args.reading_pace,
            "scenarios": len(plan.scenarios), "streams_per_scheme": len(_tasks(plan))}
    if args.json:
        write_json(args.json, results, meta)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        plot(args.plot, results)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.timeline:
        write_timeline(args.timeline, plan)
        print(f"wrote {args.timeline}", file=sys.stderr)
    return 0


def write_timeline(path: str, plan: Plan) -> None:
    """``--timeline``: the same rows ``bench e2e --timeline`` writes, for one simulated stream."""
    import json

    from eloquent_plugins.sim.timeline_record import TOKEN_FIELDS, simulated_stream

    entry = simulated_stream(plan.scenarios[0], plan.seeds[0], 0)
    with open(path, "w", encoding="utf-8") as fp:
        json.dump({"token_fields": list(TOKEN_FIELDS), "streams": [entry]}, fp, indent=1)
