"""Replay stores for resumable SSE: ``memory://`` (embedded default) and ``redis://`` (shared by replicas).

Factories are registered through the ``eloquent_register_resume_stores`` hook; ``create_store`` picks one by the
URL scheme of ``StreamConfig.resume_store``.
"""

from __future__ import annotations

from typing import Any

from eloquent_plugins.core.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.transports.resume.base import ReplaySource, ResumeStore, StoreFactory, StreamMeta
from eloquent_plugins.transports.resume.memory import MemoryStore, MemoryStoreFactory


class RedisStoreFactory:
    """Imports the Redis store only when a ``redis://`` URL is used (``redis`` is an optional dependency)."""

    schemes = ("redis", "rediss", "unix")
    scheme = "redis"

    def create(self, url: str, config: StreamConfig) -> ResumeStore:
        try:
            from eloquent_plugins.transports.resume.redis_store import RedisStore
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise ConfigError(f"{url!r} needs the redis package: pip install 'eloquent-plugins[redis]' ({exc})") \
                from None
        return RedisStore(url, ttl=config.resume_ttl)


BUILTIN_STORE_FACTORIES: tuple[Any, ...] = (MemoryStoreFactory(), RedisStoreFactory())


def create_store(config: StreamConfig, factories: list[Any] | tuple[Any, ...] = ()) -> ResumeStore:
    """The store for ``config.resume_store``: plugin factories first, then the built-in ones."""
    url = config.resume_store
    scheme = url.partition("://")[0].lower()
    for factory in (*factories, *BUILTIN_STORE_FACTORIES):
        if scheme == factory.scheme or scheme in getattr(factory, "schemes", ()):
            return factory.create(url, config)
    raise ConfigError(f"no resume store for {url!r} (scheme {scheme!r})")


__all__ = ["BUILTIN_STORE_FACTORIES", "MemoryStore", "ReplaySource", "ResumeStore", "StoreFactory", "StreamMeta",
           "create_store"]
