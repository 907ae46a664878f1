"""Teach vLLM's ``serve`` parser our flags by wrapping its parser class's parse methods.

Why this hook: vLLM has no supported way to add CLI flags, but its ``vllm.general_plugins`` run while the
``serve`` parser is being built, before parsing. Wrapping ``FlexibleArgumentParser.parse_args`` and
``parse_known_args`` on the class then (a) adds our flag group to any parser that carries vLLM's serve flags,
just before it parses (also for ``--help``), and (b) after parsing appends our middleware to ``--middleware``
when a transport is chosen. It depends on no module path that moved between releases (only the parser class
and the ``--middleware`` flag, both unchanged from 0.2x to 0.33) and on no particular build order.
"""

from __future__ import annotations

import functools
from argparse import ArgumentParser, Namespace
from typing import Any

from eloquent_plugins.core.errors import ConfigError

from eloquent_vllm.implementations import http3_server_starter, sse_middleware_class
from eloquent_vllm.options import MIDDLEWARE_PATH, EloquentVllmSettings, add_eloquent_args

_MARK = "_eloquent_vllm_parser_hook"
_SERVE_FLAGS = ("--middleware", "--api-server-count")


def is_serve_parser(parser: ArgumentParser) -> bool:
    """True for parsers built by vLLM's ``make_arg_parser`` (``vllm serve``, ``api_server.entry``, ours)."""
    options = getattr(parser, "_option_string_actions", {})
    return all(flag in options for flag in _SERVE_FLAGS)


def apply_parsed(ns: Namespace) -> EloquentVllmSettings:
    """Validate our flags against the rest and, when a transport is chosen, append our ``--middleware``.

    Idempotent (argparse may parse the same namespace twice). Raises ConfigError on a bad combination.
    """
    settings = EloquentVllmSettings.from_namespace(ns)
    if not settings.enabled:
        return settings
    settings.check_serving(ns)
    # Import now, in the CLI process, so a missing or broken implementation is a CLI error, not a dead worker.
    sse_middleware_class()
    if settings.wants_http3:
        http3_server_starter()
    current = list(getattr(ns, "middleware", None) or [])
    if MIDDLEWARE_PATH not in current:
        # A new list: argparse may have put the shared default list object on the namespace.
        ns.middleware = [*current, MIDDLEWARE_PATH]  # last = outermost: sees every request, before auth
    return settings


def install_parser_hook(parser_class: type) -> bool:
    """Wrap ``parser_class``'s parse methods once per process; False if already done."""
    if parser_class.__dict__.get(_MARK, False):
        return False
    original_parse_args = parser_class.parse_args
    original_parse_known_args = parser_class.parse_known_args

    @functools.wraps(original_parse_args)
    def parse_args(self: ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        if is_serve_parser(self):
            add_eloquent_args(self)  # before vLLM's own pre-processing of the raw argv
        return original_parse_args(self, args, namespace)

    @functools.wraps(original_parse_known_args)
    def parse_known_args(self: ArgumentParser, args: Any = None, namespace: Any = None) -> Any:
        serve = is_serve_parser(self)
        if serve:
            add_eloquent_args(self)  # subparsers (``vllm serve``) only come through here
        parsed, extras = original_parse_known_args(self, args, namespace)
        if serve:
            try:
                apply_parsed(parsed)
            except ConfigError as exc:
                self.error(str(exc))  # argparse style: usage + message, exit status 2
        return parsed, extras

    parser_class.parse_args = parse_args  # type: ignore[method-assign]
    parser_class.parse_known_args = parse_known_args  # type: ignore[method-assign]
    setattr(parser_class, _MARK, True)
    return True
