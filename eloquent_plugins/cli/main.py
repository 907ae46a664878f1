"""The ``eloquent`` console script: one entry, subcommands in ``eloquent_plugins.cli.commands``."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from eloquent_plugins import __version__
from eloquent_plugins.cli.optional import missing_extra
from eloquent_plugins.core.errors import EloquentError

COMMANDS = ("serve", "demo", "bench", "relay", "chat")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="eloquent", description="Robust, fast LLM token streaming.")
    parser.add_argument("--version", action="version", version=f"eloquent-plugins {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"eloquent_plugins.cli.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"eloquent_plugins.cli.commands.{name}":
                continue  # not shipped in this build
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except EloquentError as exc:
        print(f"eloquent {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:  # an optional dependency no call site named: still one line
        error = missing_extra(exc, f"eloquent {args.command}")
        if error is None:
            raise
        print(f"eloquent {args.command}: error: {error}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file or socket the operator named (call sites add context where they can)
        print(f"eloquent {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
