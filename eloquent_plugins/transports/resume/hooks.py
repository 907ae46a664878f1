"""The resume transport's own hook: plugins add replay stores for more URL schemes.

The core's hookspecs know nothing about resume stores. As a pytest plugin adds its hooks with
``pm.add_hookspecs``, this package adds ``eloquent_register_resume_stores`` to a plugin manager when it is about
to create a store (``plugin_store_factories``); a plugin may implement the hook before that, pluggy checks the
signature once the spec is added.
"""

from __future__ import annotations

import sys

import pluggy

from eloquent_plugins.core.hooks.specs import hookspec
from eloquent_plugins.transports.resume.base import StoreFactory


@hookspec
def eloquent_register_resume_stores() -> list[StoreFactory]:  # type: ignore[empty-body]
    """Resume store factories: objects with ``scheme`` (and optionally ``schemes``, every URL scheme they take)
    and ``create(url, config)``. A plugin factory adds its schemes to those ``--resume-store`` accepts, or
    replaces the built-in store for a built-in scheme; two plugins taking one scheme are a configuration error
    (see ``store_factory`` in this package)."""


def add_resume_hookspecs(pm: pluggy.PluginManager) -> None:
    """Add this package's hookspec to ``pm`` (once; later calls do nothing)."""
    caller = getattr(pm.hook, "eloquent_register_resume_stores", None)
    if caller is None or not caller.has_spec():
        pm.add_hookspecs(sys.modules[__name__])


def plugin_store_factories(pm: pluggy.PluginManager) -> list[StoreFactory]:
    """The store factories the plugins of ``pm`` register, in pluggy's call order."""
    add_resume_hookspecs(pm)
    return [factory for result in pm.hook.eloquent_register_resume_stores() if result for factory in result]


__all__ = ["add_resume_hookspecs", "eloquent_register_resume_stores", "plugin_store_factories"]
