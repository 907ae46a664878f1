"""``eloquent bench sim --links traces``: every scheme on the five cellular traces, with and without a bulk
download sharing the bottleneck (``sim.links``), figures from ``sim.links_report``."""

from __future__ import annotations

import argparse
import functools
import json
import sys
from concurrent.futures import ProcessPoolExecutor

from eloquent_plugins.cli.bench.sim_against import E2ERow
from eloquent_plugins.sim.links import LINK_RTT_MS, LINK_WINDOW, RealLink, load_real_link
from eloquent_plugins.sim.links_report import LinkFigures, format_links_table, link_figures
from eloquent_plugins.sim.netem.capacity import TRACE_NAMES
from eloquent_plugins.sim.run import ELOQUENT_ADAPTIVE, ELOQUENT_NEW_ONLY, ONCE, StreamRun, simulate_stream
from eloquent_plugins.sim.scenario import Scenario

LINK_SCHEMES = ("eloquent", ELOQUENT_ADAPTIVE, "retransmission", "duplication")
"""The issue's four: Eloquent, Eloquent with adaptive redundancy, retransmission (TCP), duplication (TCP x2)."""
RECARRY_BOUNDS = (ELOQUENT_NEW_ONLY, ONCE)
"""``--recarry-bounds``: Eloquent without re-carrying, and one packet per token (docs/results/redundancy.md)."""

Task = tuple[int, Scenario, int, int, tuple[str, ...]]


@functools.lru_cache(maxsize=8)
def _link(name: str, queue: int, codel: bool) -> RealLink:
    return load_real_link(name, queue, codel)  # parsed once per worker process, not once per stream


def links_plan(args: argparse.Namespace) -> list[Scenario]:
    names = args.trace or list(TRACE_NAMES)
    tokens, streams = args.tokens or 150, args.streams or 2
    crosses = (0, 1) if args.cross is None else (int(args.cross),)
    rtt = getattr(args, "link_rtt", LINK_RTT_MS)
    return [Scenario(loss=0.0, rtt_ms=rtt, tokens=tokens, streams=streams, link=name, cross=cross,
                     queue_packets=args.queue_packets, codel=int(args.codel), recarry=args.recarry_limit,
                     cross_flow=getattr(args, "cross_flow", "tcp"), decode=getattr(args, "decode", "jittered"),
                     window=getattr(args, "eloquent_window", None) or LINK_WINDOW)
            for name in names for cross in crosses]


def _run(task: Task) -> tuple[int, dict[str, StreamRun]]:
    index, scenario, seed, stream, schemes = task
    assert scenario.link is not None
    link = _link(scenario.link, scenario.queue_packets, bool(scenario.codel))
    return index, simulate_stream(scenario, seed, stream, None, schemes, link)


StreamRuns = list[tuple[int, int, dict[str, StreamRun]]]
"""One row's streams: (seed, stream, each scheme's run)."""


def run_link_streams(scenarios: list[Scenario], seeds: tuple[int, ...], jobs: int,
                     schemes: tuple[str, ...] = LINK_SCHEMES) -> list[StreamRuns]:
    """Every stream of every row, in order of seed then stream."""
    for s in scenarios:
        assert s.link is not None
        load_real_link(s.link)  # a missing trace fails now, with its path, not in a worker
    tasks = [(i, s, seed, k, schemes) for i, s in enumerate(scenarios) for seed in seeds for k in range(s.streams)]
    per: list[StreamRuns] = [[] for _ in scenarios]
    if jobs <= 1:
        results = map(_run, tasks)
    else:
        pool = ProcessPoolExecutor(max_workers=jobs)
        results = pool.map(_run, tasks)
    for task, (index, runs) in zip(tasks, results):
        per[index].append((task[2], task[3], runs))
    if jobs > 1:
        pool.shutdown()
    return per


def row_figures(per: list[StreamRuns], schemes: tuple[str, ...]) -> list[dict[str, LinkFigures]]:
    return [{name: link_figures([r[name] for _, _, r in row]) for name in schemes} for row in per]


def run_links(args: argparse.Namespace) -> int:
    scenarios = links_plan(args)
    seeds = tuple(range(args.seed, args.seed + args.seeds))
    schemes = LINK_SCHEMES + (RECARRY_BOUNDS if getattr(args, "recarry_bounds", False) else ())
    e2e = E2ERow.load(args.against, scenarios, seeds) if getattr(args, "against", None) else None  # before the run
    per = run_link_streams(scenarios, seeds, args.jobs, schemes)
    compared = e2e.against(per[e2e.index]) if e2e is not None else None
    figures = row_figures(per, schemes)
    rows = [(s.label, f) for s, f in zip(scenarios, figures)]
    print(format_links_table(rows))
    print(f"\n{len(seeds)} seed(s) x {scenarios[0].streams} streams of {scenarios[0].tokens} tokens per row; "
          f"stall: above the link's floor; raw: above the base one-way delay; x: the bulk download beside it "
          f"(cost: its throughput lost to the token stream); Eloquent inside QUIC's {scenarios[0].window} window "
          f"(held: ms from a token's generation to its first datagram going to QUIC, mean / tokens over 5 ms)")
    if compared is not None:
        print(compared.line())
    if args.json:
        doc = {"meta": {"argv": sys.argv[1:], "seeds": list(seeds)},
               "rows": [{"label": s.label, "scenario": s.as_dict(),
                         "schemes": {k: v.as_dict() for k, v in f.items()}} for s, f in zip(scenarios, figures)]}
        if compared is not None:
            doc["against"] = compared.as_dict() | {"path": args.against}
        with open(args.json, "w", encoding="utf-8") as fp:
            json.dump(doc, fp, indent=2)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        chosen = next((s for s in scenarios if s.cross), scenarios[0])
        plot_links(args.plot, chosen, seeds[0], args.plot_stream)
        print(f"wrote {args.plot}", file=sys.stderr)
    return 0


def plot_links(path: str, scenario: Scenario, seed: int = 1, stream: int = 0) -> None:
    """Stall over time on one link, the four schemes: each token's lateness above the link's floor against
    its generation time, one stream (matplotlib imported only here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert scenario.link is not None
    runs = simulate_stream(scenario, seed, stream, None, LINK_SCHEMES,
                           _link(scenario.link, scenario.queue_packets, bool(scenario.codel)))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for name, run in runs.items():
        late = [max(0.0, r - (f + run.min_delay)) * 1000 for f, r in zip(run.ready, run.rendered)]
        ax.plot(run.generated, late, label=name, linewidth=1.2, drawstyle="steps-post")
    ax.set_xlabel("seconds (token generated)")
    ax.set_ylabel("lateness above the link's floor (ms)")
    ax.set_title(f"Stall over time: {scenario.label}, seed {seed}, stream {stream} (eloquent bench sim --links)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
