"""Replay stores for resumable SSE: ``memory://`` (embedded default) and ``redis://`` (shared by replicas), plus
whatever URL schemes plugins register, and the one place a ``--resume-store`` URL becomes a store.

``store_factory`` picks a factory by the URL scheme of ``StreamConfig.resume_store``, and refuses a scheme no
factory takes with a ``ConfigError`` naming the known ones (``StreamConfig`` does not check the scheme: only this
package knows which stores are installed). The precedence is fixed, never left to the order entry points load in:

1. a plugin factory (the ``eloquent_register_resume_stores`` hook, ``resume.hooks``) that takes the scheme wins,
   whether the scheme is a new one or a built-in one it replaces; two plugin factories taking the scheme in use
   are a ``ConfigError``;
2. otherwise the built-in store for the scheme (``memory``; ``redis``, ``rediss``, ``unix``).

``check_resume_store`` runs the same choice without building a store, for the commands that must refuse a bad
URL at startup before anything creates the store (the vLLM plugin builds its middleware on the first request).
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.hooks.manager import create_plugin_manager
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.resume.base import ReplaySource, ResumeStore, StoreFactory, StreamMeta
from eloquent_plugins.transports.resume.hooks import plugin_store_factories
from eloquent_plugins.transports.resume.memory import MemoryStore, MemoryStoreFactory


class RedisStoreFactory:
    """Imports the Redis store only when a ``redis://`` URL is used (``redis`` is an optional dependency)."""

    schemes = ("redis", "rediss", "unix")
    scheme = "redis"

    def create(self, url: str, config: StreamConfig) -> ResumeStore:
        try:
            import redis.asyncio  # noqa: F401 - optional: fail here with the extra's name, not in the store
        except ModuleNotFoundError as exc:
            raise ConfigError(f"--resume-store {url.partition('://')[0]}:// needs the [redis] extra (no module "
                              f"named {exc.name!r}): pip install 'eloquent-plugins[redis]'") from None
        from eloquent_plugins.transports.resume.redis_store import RedisStore

        return RedisStore(url, ttl=config.resume_ttl)


BUILTIN_STORE_FACTORIES: tuple[StoreFactory, ...] = (MemoryStoreFactory(), RedisStoreFactory())


def _schemes(factory: StoreFactory) -> tuple[str, ...]:
    return (factory.scheme, *getattr(factory, "schemes", ()))


def known_schemes(factories: Iterable[StoreFactory] = ()) -> list[str]:
    """Every URL scheme a store can be made for: the built-in ones and those of ``factories``."""
    return sorted({scheme.lower() for f in (*factories, *BUILTIN_STORE_FACTORIES) for scheme in _schemes(f)})


def store_factory(url: str, factories: Iterable[StoreFactory] = ()) -> StoreFactory:
    """The factory for ``url``: the one plugin factory in ``factories`` that takes its scheme, else the built-in
    one (see the module docstring for the rule); a ``ConfigError`` for a scheme none takes."""
    plugins = list(factories)
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower() if sep else ""
    claimants = list({id(f): f for f in plugins if scheme in _schemes(f)}.values())
    if len(claimants) > 1:
        names = ", ".join(sorted(type(f).__qualname__ for f in claimants))
        raise ConfigError(f"several resume store plugins take scheme {scheme!r} ({names}); uninstall all but one")
    for factory in (*claimants, *BUILTIN_STORE_FACTORIES):
        if scheme in _schemes(factory):
            return factory
    known = ", ".join(f"{name}://" for name in known_schemes(plugins))
    raise ConfigError(f"resume store must be one of {known} (a store plugin adds more), got {url!r}")


def create_store(config: StreamConfig, factories: Iterable[StoreFactory] = ()) -> ResumeStore:
    """The store for ``config.resume_store``, made by ``store_factory``'s choice among ``factories``."""
    return store_factory(config.resume_store, factories).create(config.resume_store, config)


def check_resume_store(config: StreamConfig, pm: pluggy.PluginManager | None = None) -> None:
    """Refuse, with a ``ConfigError``, a ``resume_store`` no installed store takes (``pm``: the plugin manager
    the server will use; by default one with the installed entry points). Nothing to check with resume off."""
    if not config.resume:
        return
    if pm is None:
        pm = create_plugin_manager()
    store_factory(config.resume_store, plugin_store_factories(pm))


__all__ = ["BUILTIN_STORE_FACTORIES", "MemoryStore", "RedisStoreFactory", "ReplaySource", "ResumeStore",
           "StoreFactory", "StreamMeta", "check_resume_store", "create_store", "known_schemes", "store_factory"]
