"""``eloquent bench sim|e2e|overhead|load``: benchmarks that print figures side by side."""

from __future__ import annotations

import argparse
import importlib

BENCHES = {
    "sim": "stall ratio of Eloquent vs retransmission, duplication and the oracle in the network simulator",
    "e2e": "the same comparison end to end over real QUIC through the lossy relay",
    "overhead": "events/s and CPU per event through the middleware vs the bare app and sse-starlette; with "
                "--vllm/--target: streamed vs non-streamed tokens/s of a live server, with and without the plugin",
    "load": "many concurrent SSE and HTTP/3 streams: memory, throughput, p99 gap, errors",
}


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
        bench_parser.set_defaults(func=module.run)
