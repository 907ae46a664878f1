"""Upstream kinds: how ``--upstream KIND=URL`` turns into a gateway (an ASGI app), and their plugin hook.

An upstream kind builds an ASGI app from deployment settings, so it belongs to the transports, not the core.
Its hook is this module's own: as pytest plugins add their hooks with ``pm.add_hookspecs`` (and as
``transports/resume/hooks.py`` does for resume stores), ``upstream_kinds`` adds ``eloquent_register_upstreams``
to a plugin manager before it asks; an adapter may implement the hook before that (the ``tgi``, ``triton`` and
``openai`` adapters register through ``eloquent_plugins`` entry points), pluggy checks the signature once the
spec is added.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pluggy

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.hooks.specs import hookspec
from eloquent_plugins.transports.config import StreamConfig


@dataclass(frozen=True, slots=True)
class UpstreamKind:
    name: str
    """The KIND in ``--upstream KIND=URL``, e.g. ``tgi`` or ``triton``."""
    create_app: Callable[[str, StreamConfig], Callable[..., Any]]
    """Build the gateway app for an upstream URL: an ASGI app (``transports.asgi.ASGIApp``)."""
    description: str = ""


def parse_upstream(spec: str) -> tuple[str, str]:
    """Split ``KIND=URL``; a clear error for anything else."""
    kind, sep, url = spec.partition("=")
    if not sep or not kind or not url:
        raise ConfigError(f"--upstream expects KIND=URL (e.g. tgi=http://127.0.0.1:8080), got {spec!r}")
    if "://" not in url:
        raise ConfigError(f"--upstream URL must include a scheme (http://, grpc://), got {url!r}")
    return kind.strip().lower(), url.strip()


@hookspec
def eloquent_register_upstreams() -> list[UpstreamKind]:  # type: ignore[empty-body]
    """Upstream kinds for ``--upstream KIND=URL``."""


def add_upstream_hookspecs(pm: pluggy.PluginManager) -> None:
    """Add this module's hookspec to ``pm`` (once; later calls do nothing)."""
    caller = getattr(pm.hook, "eloquent_register_upstreams", None)
    if caller is None or not caller.has_spec():
        pm.add_hookspecs(sys.modules[__name__])


def upstream_kinds(pm: pluggy.PluginManager) -> dict[str, UpstreamKind]:
    """The upstream kinds the plugins of ``pm`` register, by name."""
    add_upstream_hookspecs(pm)
    return {kind.name: kind for result in pm.hook.eloquent_register_upstreams() if result for kind in result}


def upstream_kind(pm: pluggy.PluginManager, name: str) -> UpstreamKind:
    """The kind called ``name``; a ``ConfigError`` naming the installed kinds (and the extra to install) if none."""
    kinds = upstream_kinds(pm)
    if name not in kinds:
        known = ", ".join(sorted(kinds)) or "none installed"
        raise ConfigError(f"unknown upstream kind {name!r} (known: {known}); "
                          f"install its adapter, e.g. pip install 'eloquent-plugins[{name}]'")
    return kinds[name]


__all__ = ["UpstreamKind", "add_upstream_hookspecs", "eloquent_register_upstreams", "parse_upstream",
           "upstream_kind", "upstream_kinds"]
