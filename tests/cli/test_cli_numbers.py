"""Every number on every ``eloquent`` command line is checked when it is parsed: a bad one is an argparse error
(exit 2, naming the option), never a traceback from deep inside nor a value taken silently (``--keepalive nan``
used to turn keep-alive off; ``--tpot nan`` and ``--port 99999`` used to end in tracebacks)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eloquent_plugins.cli.main import build_parser

ELOQUENT = str(Path(sys.executable).with_name("eloquent"))
NEVER_A_NUMBER_HERE = ("nan", "inf", "-inf", "-1", "1e400", "soon", "")


def _walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...],
                                                                                         argparse.Action]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, (*path, name))
        elif action.option_strings or action.dest != "help":
            yield path, action


OPTIONS = [(path, action) for path, action in _walk(build_parser()) if action.type is not None]
NUMERIC = [(p, a) for p, a in OPTIONS if getattr(a.type, "number_type", False) or a.type in (int, float)]


def _id(item: tuple[tuple[str, ...], argparse.Action]) -> str:
    path, action = item
    return " ".join([*path, action.option_strings[0] if action.option_strings else action.dest])


def test_the_walk_finds_the_commands_numbers() -> None:
    found = {_id(item) for item in NUMERIC}
    for known in ("serve --port", "serve --tpot", "serve --keepalive", "demo --loss", "relay --delay-ms",
                  "chat --timeout", "bench load --sse", "bench sim --jobs", "bench e2e --rtt-ms"):
        assert known in found, (known, sorted(found))


@pytest.mark.parametrize("item", NUMERIC, ids=_id)
def test_every_numeric_option_is_checked(item: tuple[tuple[str, ...], argparse.Action]) -> None:
    _, action = item
    assert action.type not in (int, float), "a bare int/float takes NaN, infinity and negatives: use commands.numbers"
    convert: Callable[[str], Any] = action.type  # type: ignore[assignment]
    for bad in NEVER_A_NUMBER_HERE:
        with pytest.raises(argparse.ArgumentTypeError, match=r"^expected "):
            convert(bad)
    if action.default is not None and action.default != argparse.SUPPRESS:
        assert convert(str(action.default)) == action.default  # the shipped default passes its own check


@pytest.mark.parametrize("argv", [
    ["serve", "--keepalive", "nan"], ["serve", "--tpot", "nan"], ["serve", "--ttft", "-1"],
    ["serve", "--port", "99999"], ["serve", "--eloquent-port", "-5"], ["serve", "--max-streams-per-client", "inf"],
    ["demo", "--tpot-ms", "nan"], ["demo", "--loss", "1"], ["demo", "--burst", "0.5"],
    ["chat", "--timeout", "0", "hi"], ["relay", "--target", "127.0.0.1:9", "--delay-ms", "nan"],
    ["bench", "load", "--duration", "nan"], ["bench", "sim", "--jobs", "0"],
])
def test_the_console_script_refuses_with_exit_2_and_names_the_option(argv: list[str]) -> None:
    done = subprocess.run([ELOQUENT, *argv], capture_output=True, text=True, timeout=60, check=False)
    option = next(a for a in argv if a.startswith("--") and a != "--target")
    assert done.returncode == 2, done.stdout + done.stderr
    assert f"argument {option}: expected " in done.stderr and "Traceback" not in done.stderr, done.stderr
