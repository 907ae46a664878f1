"""``docs/FLAGS.md``, generated from the parsers: ``python docs/flagtable.py [--write|--check]``.

Why generated: the table is the vocabulary's reference, and a hand-kept one drifts. ``tests/test_flags.py`` fails
when the file and the parsers differ; rerun with ``--write`` after changing a flag. A script beside the docs, not a
module of the package: it reads the vLLM adapter's parser too, and the package never imports an adapter.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path

from eloquent_plugins.cli.flags import ALIAS, SETTING
from eloquent_plugins.cli.main import build_parser
from eloquent_plugins.transports.config import env_name, plugin_flag

DOC = Path(__file__).resolve().parent / "FLAGS.md"

HEADER = """# Flags

Generated from the parsers by `python docs/flagtable.py --write`; `tests/test_flags.py` fails when
this file and the parsers differ. Do not edit by hand.

The rules every command follows:

- **One name per setting.** A setting has the same flag on every command. The vLLM plugin (`vllm serve`,
  `python -m eloquent_vllm.serve`) spells it with `--eloquent-` in front (`--keepalive` -> `--eloquent-keepalive`),
  except names that already start with `eloquent-` and the `--stream-transport` switch.
- **Command line > environment > default.** Every flag with a variable in the *env* column reads it when the flag
  is not given (`ELOQUENT_<FLAG>`, the same variable for the plugin's prefixed spelling). Switches read
  `1/true/yes/on` and `0/false/no/off`. A bad value is a one-line error naming the variable.
- **Durations are seconds**, and a duration flag has no unit in its name (`--tpot 0.03`). The old `-ms`
  spellings (`--tpot-ms 30`, `--rtt-ms`, `--delay-ms`, ...) still work, take milliseconds and print one line
  saying what to write instead. Other units are named in the flag (`--bandwidth-kbps`, `--queue-kb`).
- **`--port 0`** picks one number free on both TCP and UDP: the HTTP/3 front end shares the HTTP port's number.
  `--eloquent-port` with a `--stream-transport` other than `eloquent` is an error, not ignored.
- **TLS:** `eloquent serve --certfile C --keyfile K` serves HTTPS on TCP and HTTP/3 on UDP from the same files
  (browsers honour `Alt-Svc` only over HTTPS). Without them TCP is plain HTTP and HTTP/3 uses a generated
  development certificate.
- **Every bench** takes `--progress/--no-progress` (default: on only when stderr is a terminal) and `--plot PNG`.
"""


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> Iterator[
        tuple[tuple[str, ...], argparse.ArgumentParser]]:
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs and path:
        yield path, parser
    for action in subs:
        for name, sub in action.choices.items():
            yield from _commands(sub, (*path, name))


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _rows(parser: argparse.ArgumentParser) -> Iterator[str]:
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or action.dest == "help":
            continue
        flags = ", ".join(f"`{s}`" for s in action.option_strings)
        setting = getattr(action, SETTING, None)
        env = f"`{setting.env}`" if setting is not None and setting.env else ""
        help_text = formatter._expand_help(action) if action.help else ""
        aliases = [a for a in parser._actions if getattr(a, ALIAS, None) in action.option_strings]
        if aliases:
            help_text += " (deprecated: " + ", ".join(f"`{s}` MS" for a in aliases for s in a.option_strings) + ")"
        yield f"| {flags} | {env} | {_cell(help_text)} |"


def vllm_rows() -> Iterator[str]:
    """The plugin's flags, from its own argparse hook on a bare parser (vLLM need not be installed)."""
    try:
        from eloquent_vllm.options import SHARED_FLAGS, add_eloquent_args
    except ImportError:  # not installed: the source tree has it
        sys.path.insert(0, str(DOC.parents[1] / "adapters" / "vllm"))
        from eloquent_vllm.options import SHARED_FLAGS, add_eloquent_args
    parser = argparse.ArgumentParser()
    add_eloquent_args(parser)
    for name, _, _ in SHARED_FLAGS:
        action = parser._option_string_actions[plugin_flag(name)]
        yield f"| `{plugin_flag(name)}` | `{name}` | `{env_name(name)}` | {_cell(action.help or '')} |"


def render() -> str:
    parts = [HEADER]
    for path, parser in _commands(build_parser()):
        parts.append(f"\n## eloquent {' '.join(path)}\n\n| flag | env | meaning |\n|---|---|---|")
        parts.extend(_rows(parser))
    rows = list(vllm_rows())
    if rows:
        parts.append("\n## vllm serve (the eloquent-vllm plugin)\n\n| flag | eloquent serve | env | meaning |\n"
                     "|---|---|---|---|")
        parts.extend(rows)
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python docs/flagtable.py", description=__doc__)
    parser.add_argument("--write", action="store_true", help=f"write {DOC}")
    parser.add_argument("--check", action="store_true", help="exit 1 when the file differs")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        DOC.write_text(text, encoding="utf-8")
    elif args.check:
        same = DOC.is_file() and DOC.read_text(encoding="utf-8") == text
        print("docs/FLAGS.md is up to date" if same else "docs/FLAGS.md differs: rerun with --write")
        return 0 if same else 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
