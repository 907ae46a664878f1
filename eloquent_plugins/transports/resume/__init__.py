"""Replay stores for resumable SSE: ``memory://`` (embedded default) and ``redis://`` (shared by replicas).

``create_store`` picks a factory by the URL scheme of ``StreamConfig.resume_store``. The precedence is fixed,
never left to the order entry points load in:

1. a plugin factory (the ``eloquent_register_resume_stores`` hook, ``resume.hooks``) that takes the scheme wins;
   two plugin factories taking the scheme in use are a ``ConfigError``;
2. otherwise the built-in store for the scheme (``memory``; ``redis``, ``rediss``, ``unix``).

Plugins come first because ``StreamConfig`` (core, which cannot know plugins) admits only the built-in schemes:
replacing a built-in store is the one thing a store plugin can do.
"""

from __future__ import annotations

from collections.abc import Iterable

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.resume.base import ReplaySource, ResumeStore, StoreFactory, StreamMeta
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


def _takes(factory: StoreFactory, scheme: str) -> bool:
    return scheme == factory.scheme or scheme in getattr(factory, "schemes", ())


def create_store(config: StreamConfig, factories: Iterable[StoreFactory] = ()) -> ResumeStore:
    """The store for ``config.resume_store``: the one plugin factory in ``factories`` that takes the scheme,
    else the built-in one (see the module docstring for the rule)."""
    url = config.resume_store
    scheme = url.partition("://")[0].lower()
    claimants = list({id(f): f for f in factories if _takes(f, scheme)}.values())
    if len(claimants) > 1:
        names = ", ".join(sorted(type(f).__qualname__ for f in claimants))
        raise ConfigError(f"several resume store plugins take scheme {scheme!r} ({names}); uninstall all but one")
    for factory in (*claimants, *BUILTIN_STORE_FACTORIES):
        if _takes(factory, scheme):
            return factory.create(url, config)
    raise ConfigError(f"no resume store for {url!r} (scheme {scheme!r})")


__all__ = ["BUILTIN_STORE_FACTORIES", "MemoryStore", "RedisStoreFactory", "ReplaySource", "ResumeStore",
           "StoreFactory", "StreamMeta", "create_store"]
