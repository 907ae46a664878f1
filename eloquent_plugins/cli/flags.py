"""The machinery of the one flag vocabulary (issue 17), shared by ``cli/commands`` and ``cli/bench``.

The rules every command follows (``docs/FLAGS.md`` is generated from the parsers by ``docs/flagtable.py``):

* **Settings read the environment.** A flag added with :func:`add_setting` reads ``ELOQUENT_<FLAG>`` when it is
  not on the command line: CLI beats environment beats default. argparse sees ``default=None``, the real default
  lives on the action, and :func:`resolve` (run by :func:`command` before the command) fills it in -- so "given
  on the command line" and "left to the default" stay distinguishable (issue 17: ``ELOQUENT_KEEPALIVE=1`` was
  ignored because ``--keepalive`` defaulted to 15 in argparse).
* **Durations are seconds**, and a duration flag carries no unit in its name (``--tpot 0.03``). The old
  ``-ms`` spellings (``--tpot-ms 30``) stay as hidden aliases that take milliseconds and print one line saying
  what to write instead. Other units stay in the name (``--bandwidth-kbps``, ``--queue-kb``).
* ``--progress/--no-progress`` (default: on only when stderr is a terminal) and ``--plot PNG`` on every bench.

Here and not in ``commands/common.py`` because benches may not import ``cli.commands`` (the layering test).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from eloquent_plugins.cli import numbers
from eloquent_plugins.transports.config import env_name
from eloquent_plugins.core.errors import ConfigError

SETTING = "eloquent_setting"
"""The attribute :func:`add_setting` puts on an argparse action (a :class:`Setting`)."""
ALIAS = "eloquent_alias_of"
"""The attribute a deprecated alias action carries: the flag to write instead."""


@dataclass(frozen=True)
class Setting:
    env: str
    default: Any
    """The value when neither the command line nor the environment gives one; a callable is asked then."""
    shown: str
    """The default as the help and the table show it."""


def add_setting(container: Any, flag: str, *, default: Any, help: str, shown: str | None = None,
                env: bool = True, **kwargs: Any) -> argparse.Action:
    """``container.add_argument(flag, ...)`` for a setting: CLI > ``ELOQUENT_<FLAG>`` > ``default``."""
    shown = shown if shown is not None else ("none" if default is None else f"{default:g}"
                                             if isinstance(default, float) else str(default))
    name = env_name(flag) if env else ""
    suffix = f"default: {shown}; env {name}" if env else f"default: {shown}"
    action = container.add_argument(flag, default=None, help=f"{help} ({suffix})", **kwargs)
    setattr(action, SETTING, Setting(name, default, shown))
    return action


def boolean(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected 1/0, true/false, yes/no or on/off, got {text!r}")


def _from_env(action: argparse.Action, name: str, raw: str) -> Any:
    try:
        if action.nargs == 0:  # a switch (store_true, --x/--no-x)
            value = boolean(raw)
            return (not value) if isinstance(action, argparse._StoreFalseAction) else value
        value = action.type(raw) if callable(action.type) else raw
    except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
        raise ConfigError(f"{name}={raw!r}: {exc}") from None
    if action.choices is not None and value not in action.choices:
        raise ConfigError(f"{name}={raw!r}: choose one of {', '.join(map(str, action.choices))}")
    return value


def resolve(parser: argparse.ArgumentParser, args: argparse.Namespace,
            environ: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Fill every setting the command line left out: from its ``ELOQUENT_*`` variable, else its default."""
    import os

    env = os.environ if environ is None else environ
    for action in parser._actions:
        setting: Setting | None = getattr(action, SETTING, None)
        if setting is None or getattr(args, action.dest, None) is not None:
            continue
        raw = env.get(setting.env) if setting.env else None
        if raw is not None and raw.strip() != "":
            value = _from_env(action, setting.env, raw)
        else:
            value = setting.default() if callable(setting.default) else setting.default
        setattr(args, action.dest, value)
    return args


class _Resolved:
    """``func`` of a (sub)command: resolve its settings, then run it (what ``eloquent``'s ``main`` calls)."""

    def __init__(self, parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int]) -> None:
        self.parser, self.run = parser, run

    def __call__(self, args: argparse.Namespace) -> int:
        return self.run(resolve(self.parser, args))


def command(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], int]) -> None:
    parser.set_defaults(func=_Resolved(parser, run))


def parse(parser: argparse.ArgumentParser, argv: list[str], environ: Mapping[str, str] | None = None
          ) -> argparse.Namespace:
    """Parse and resolve in one (tests, ``main()`` of a bench run as a module)."""
    return resolve(parser, parser.parse_args(argv), environ)


# -- durations ----------------------------------------------------------------------------------------------------


class _MillisecondsAlias(argparse.Action):
    """A deprecated ``--x-ms MS`` spelling: stores seconds under the new flag's dest, says so once."""

    def __init__(self, option_strings: list[str], dest: str, *, new_flag: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        setattr(self, ALIAS, new_flag)
        self.warned = False  # one line per parse, however often the flag is given

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        seconds = float(values) / 1000
        if not self.warned:
            self.warned = True
            print(f"{parser.prog}: {option_string} is deprecated (durations are seconds): use "
                  f"{getattr(self, ALIAS)} {seconds:g}", file=sys.stderr)
        setattr(namespace, self.dest, seconds)


def add_ms_alias(container: Any, old: str, new: str) -> argparse.Action:
    """Keep ``old`` (milliseconds) working as a hidden alias of the seconds flag ``new``."""
    dest = new.lstrip("-").replace("-", "_")
    return container.add_argument(old, dest=dest, type=numbers.milliseconds, action=_MillisecondsAlias,
                                  new_flag=new, default=argparse.SUPPRESS, help=argparse.SUPPRESS, metavar="MS")


def add_duration(container: Any, flag: str, *, default: float | None, help: str, old_ms: str | None = None,
                 kind: Callable[[str], float] = numbers.seconds) -> argparse.Action:
    """A duration flag in seconds (``%(default)s`` in ``help`` is filled), with its deprecated ``-ms`` alias."""
    action = container.add_argument(flag, type=kind, default=default, metavar="SECONDS", help=help)
    if old_ms:
        add_ms_alias(container, old_ms, flag)
    return action


# -- every bench -------------------------------------------------------------------------------------------------


def _stderr_is_terminal() -> bool:
    return sys.stderr.isatty()


def add_progress(parser: argparse.ArgumentParser) -> None:
    """``--progress/--no-progress``: progress lines on stderr; by default only on a terminal (no ``\\r`` bars
    in CI logs)."""
    if "--progress" in parser._option_string_actions:
        return
    add_setting(parser, "--progress", action=argparse.BooleanOptionalAction, default=_stderr_is_terminal,
                shown="on when stderr is a terminal", help="progress on stderr")


def add_plot(parser: argparse.ArgumentParser, help: str = "write a PNG of the figures (needs matplotlib)") -> None:
    if "--plot" not in parser._option_string_actions:
        parser.add_argument("--plot", metavar="PNG", default=None, help=help)


__all__ = ["Setting", "add_duration", "add_ms_alias", "add_plot", "add_progress", "add_setting", "boolean",
           "command", "parse", "resolve"]
