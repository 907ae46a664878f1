"""``eloquent bench sim|e2e|overhead|load|leak``: benchmarks that print figures side by side.

Every bench takes ``--progress/--no-progress`` and ``--plot PNG`` (issue 17). A bench whose module draws its own
figure (``sim``, ``e2e``) handles ``--plot`` itself; for the others the figures their ``--json`` holds are drawn
here (a temporary JSON when none was asked for).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

from eloquent_plugins.cli.flags import add_plot, add_progress, command

BENCHES = {
    "sim": "stall ratio of Eloquent vs retransmission, duplication and the oracle in the network simulator",
    "e2e": "the same comparison end to end over real QUIC through the lossy relay",
    "overhead": "events/s and CPU per event through the middleware vs the bare app and sse-starlette; with "
                "--vllm/--target: streamed vs non-streamed tokens/s of a live server, with and without the plugin",
    "load": "many concurrent SSE and HTTP/3 streams: memory, throughput, p99 gap, errors",
    "leak": "what an observer of the encrypted stream learns from write/datagram sizes and times, per --padding "
            "mode: token lengths, which of N answers, and what padding costs",
}
OWN_PLOT = ("sim", "e2e")


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("bench", help="run a benchmark and print its figures")
    benches = parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    for name, help_text in BENCHES.items():
        try:
            module = importlib.import_module(f"eloquent_plugins.cli.bench.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"eloquent_plugins.cli.bench.{name}":
                continue
            raise
        bench_parser = benches.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(bench_parser)
        add_progress(bench_parser)  # no-ops where the bench declared them itself
        add_plot(bench_parser)
        command(bench_parser, module.run if name in OWN_PLOT else _plotting(module.run))


def _plotting(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def with_plot(args: argparse.Namespace) -> int:
        if not args.plot:
            return run(args)
        from eloquent_plugins.cli.optional import needs_extra

        with needs_extra(f"bench {args.bench} --plot"):
            import matplotlib  # noqa: F401 - before the run, not after it
        own = getattr(args, "json", None)
        if own is None:
            fd, args.json = tempfile.mkstemp(prefix="eloquent-bench-", suffix=".json")
            os.close(fd)
        try:
            status = run(args)
            with open(args.json, encoding="utf-8") as fp:
                plot_figures(args.plot, json.load(fp), f"eloquent bench {args.bench}")
            print(f"wrote {args.plot}", file=sys.stderr)
            return status
        finally:
            if own is None:
                os.unlink(args.json)
    return with_plot


def plot_figures(path: str, data: dict[str, Any], title: str) -> None:
    """Samples over time when the figures have them (``load``), else one bar per variant or target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    samples = data.get("samples")
    if isinstance(samples, list) and samples and isinstance(samples[0], dict):
        keys = [k for k, v in samples[0].items() if isinstance(v, (int, float)) and k not in ("t", "time")]
        t0 = samples[0].get("t", 0)
        xs = [s.get("t", i) - t0 for i, s in enumerate(samples)]
        for key in keys[:6]:
            ax.plot(xs, [s.get(key, 0) for s in samples], label=key)
        ax.set_xlabel("seconds")
        ax.legend()
    else:
        rows = data.get("variants") or data.get("targets") or []
        labels = [str(r.get("variant") or r.get("label") or i) for i, r in enumerate(rows)]
        values = [float(r.get("events_per_s") or r.get("tokens_per_s") or 0) for r in rows]
        ax.bar(labels, values)
        ax.set_ylabel("events/s" if data.get("variants") else "tokens/s")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
