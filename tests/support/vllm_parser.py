"""The slice of vLLM's ``serve`` argument parser the adapter's parse hook reads, without importing vLLM."""

from __future__ import annotations

import argparse

from eloquent_vllm.cli_hook import install_parser_hook


def serve_parser() -> argparse.ArgumentParser:
    """The slice of vLLM's serve parser the adapter reads, on a fresh class so each test installs its own hook."""
    parser_class = type("ServeParser", (argparse.ArgumentParser,), {})
    install_parser_hook(parser_class)
    parser = parser_class(prog="vllm serve")
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--middleware", action="append", default=[])
    parser.add_argument("--api-server-count", type=int, default=None)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--host", default=None)
    parser.add_argument("--uds", default=None)
    parser.add_argument("--headless", action="store_true")
    parser.add_argument("--data-parallel-size", type=int, default=1)
    parser.add_argument("--ssl-certfile", default=None)
    parser.add_argument("--ssl-keyfile", default=None)
    parser.add_argument("--grpc", action="store_true")
    return parser
