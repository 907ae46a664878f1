"""What the pieces of a stream need of the middleware that hosts them, as Protocols of read-only members (a piece reads its host, never sets it).

Why: the exchange (a new stream), the resume endpoint and a migration each name only the members they use of
their host, not ``EloquentMiddleware``, so none imports its owner (no import circle) and each can be driven
against a small host of its own in a test. ``EloquentMiddleware`` satisfies all three.
"""

from __future__ import annotations

from typing import Any, Protocol

import pluggy

from eloquent_plugins.core.codecs.base import Codec
from eloquent_plugins.core.codecs.router import CodecRouter
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.padding import PaddingPolicy
from eloquent_plugins.transports.asgi import ASGIApp
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.transports.drain import Drain
from eloquent_plugins.transports.metrics import StreamMetrics
from eloquent_plugins.transports.resume.base import ResumeStore
from eloquent_plugins.transports.sse.budget import StreamBudget
from eloquent_plugins.transports.sse.connection import Merge
from eloquent_plugins.transports.sse.ids import IdentityFunction
from eloquent_plugins.transports.sse.limits import ClientLimits


class LocalStream(Protocol):
    """A stream produced in this process, as a resume here sees it (``exchange.Exchange``)."""

    def reader_seen(self, delta: int = 0) -> None:
        """Its owner asked for it here (0), or a resume connection here started (+1) or ended (-1)."""


class MigrationHost(Protocol):
    """What ``migrate.Migration`` uses: the app to send the continuation to, and the stream's plumbing."""

    @property
    def app(self) -> ASGIApp: ...
    @property
    def config(self) -> StreamConfig: ...
    @property
    def pm(self) -> pluggy.PluginManager: ...
    @property
    def codecs(self) -> dict[str, Codec]: ...
    @property
    def metrics(self) -> StreamMetrics: ...
    @property
    def store(self) -> ResumeStore | None: ...


class ResumeHost(MigrationHost, Protocol):
    """What ``resume.serve_resume`` uses (and hands on to a migration)."""

    @property
    def identity(self) -> IdentityFunction | None: ...
    @property
    def router(self) -> CodecRouter: ...
    @property
    def policy(self) -> KeepAlivePolicy: ...
    @property
    def padding(self) -> PaddingPolicy | None: ...
    @property
    def lease_ttl(self) -> float: ...
    @property
    def budget(self) -> StreamBudget: ...
    @property
    def drain(self) -> Drain: ...
    @property
    def exchanges(self) -> dict[str, LocalStream]: ...
    @property
    def spans(self) -> dict[str, Any]: ...
    @property
    def tracer(self) -> Any: ...

    def merge_for(self, codec: Codec) -> Merge | None: ...


class StreamHost(Protocol):
    """What ``exchange.Exchange`` uses: a new stream's app, its store, budget, limits and telemetry."""

    @property
    def app(self) -> ASGIApp: ...
    @property
    def config(self) -> StreamConfig: ...
    @property
    def pm(self) -> pluggy.PluginManager: ...
    @property
    def metrics(self) -> StreamMetrics: ...
    @property
    def store(self) -> ResumeStore | None: ...
    @property
    def identity(self) -> IdentityFunction | None: ...
    @property
    def router(self) -> CodecRouter: ...
    @property
    def limits(self) -> ClientLimits: ...
    @property
    def policy(self) -> KeepAlivePolicy: ...
    @property
    def padding(self) -> PaddingPolicy | None: ...
    @property
    def budget(self) -> StreamBudget: ...
    @property
    def drain(self) -> Drain: ...
    @property
    def exchanges(self) -> dict[str, LocalStream]: ...
    @property
    def spans(self) -> dict[str, Any]: ...
    @property
    def tracer(self) -> Any: ...

    def codec_for(self, path: str) -> Codec: ...

    def merge_for(self, codec: Codec) -> Merge | None: ...
