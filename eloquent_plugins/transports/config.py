"""Server and deployment settings, read from ``ELOQUENT_*`` variables (CLI flag > env var > default).

``StreamConfig`` and the flag-name helpers are shared by the transports, the adapters and the CLI, which is why
they live here and not in the core: the core's state machines take their own small configs (``Limits``,
``KeepAlivePolicy``, ``SenderConfig``), so they never see a deployment setting they do not use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Literal

from eloquent_plugins.core.checks import require_finite
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.keepalive import KeepAlivePolicy
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.pacing import check_tick
from eloquent_plugins.core.padding import parse_mode
from eloquent_plugins.transports.body_budget import check_settings

StreamTransport = Literal["sse", "eloquent"]


@dataclass(frozen=True, slots=True)
class StreamConfig:
    keepalive: float = 15.0
    """Seconds without bytes before a keep-alive (0: off)."""
    keepalive_frame: Literal["comment", "newline"] = "comment"
    stream_transport: StreamTransport = "eloquent"
    """``sse``: SSE improvements only; ``eloquent``: also the HTTP/3 datagram front end."""
    resume: bool = True
    resume_store: str = "memory://"
    """``memory://`` (one process), ``redis://host:port/db`` (replicas share streams) or a scheme a store plugin
    registers; the resume package checks the scheme (``transports.resume.store_factory``), not this class."""
    resume_ttl: float = 300.0
    """Seconds a finished stream stays resumable."""
    resume_grace: float = 5.0
    """Seconds an abandoned stream keeps generating so a quick reconnect loses nothing; then it is aborted."""
    coalesce: bool = True
    merge_deltas: bool = False
    """Merge queued OpenAI text deltas into one chunk (changes event boundaries; off by default)."""
    eloquent_port: int | None = None
    """UDP port of the HTTP/3 front end (None: same number as the HTTP port)."""
    certfile: str | None = None
    keyfile: str | None = None
    send_timeout: float = 30.0
    """A client that accepts no bytes for this long is cut (slow readers, slowloris)."""
    header_timeout: float = 30.0
    """``eloquent serve`` (uvicorn/h11): seconds a client has to send a request's line and headers, counted from
    the connection opening or from the first byte after a response (0: off)."""
    body_timeout: float = 30.0
    """Seconds the app may wait for the next chunk of a request body before a ``408`` (0: off)."""
    body_min_rate: int = 1024
    """Bytes/s a request body (or a WebTransport request head) must keep up once ``body_rate_grace`` is over, bytes
    sent ahead of the pace counting for at most ``body_timeout`` seconds; slower: ``408`` (0: off). A trickle (a
    byte every 29 s) then no longer keeps a body alive. See ``transports/body_budget.py``."""
    body_rate_grace: float = 10.0
    """Seconds from a request's head before ``body_min_rate`` applies."""
    max_body_bytes_per_connection: int = 8 << 20
    """Bytes of incomplete request bodies and WebTransport request heads one connection may have the server hold at
    once (with a reserve per request); past it ``429`` (``413`` for one body that alone would pass it; 0: off)."""
    max_body_bytes_per_address: int = 32 << 20
    """The same over every connection from one source address (behind a proxy: the proxy's; 0: off). All such
    bytes together count in ``max_held_bytes`` and may take a quarter of it (then ``503``)."""
    max_streams_per_client: int = 0
    """Live SSE streams one caller (credentials, else client IP) may hold at once; above it a ``429``
    (0: unlimited)."""
    max_queued_bytes: int = 1 << 20
    """Bytes an SSE stream may hold for one connected client beyond what has been written to it (a client that
    does not read); above it the client is cut, and it can resume (0: off)."""
    max_held_bytes: int = 512 << 20
    """Bytes one middleware's SSE streams may hold: their logs (replay history, events queued for clients),
    a reserve per live stream, what the server buffers for connected clients, finished streams kept for resume.
    From 75% of it: finished streams are evicted oldest first, then history every reader has been written, then
    the streams of clients cut for not reading (their engine requests aborted); at it, the clients with the most
    queued are cut and new streams get ``503`` with ``Retry-After`` (0: off). See ``transports/sse/budget.py``."""
    socket_send_buffer: int = 128 << 10
    """``eloquent serve`` (uvicorn/h11): the kernel send buffer (``SO_SNDBUF``) of each HTTP/1.1 connection. Left
    to autotuning, the kernel takes megabytes for a client that does not read, so no send ever stalls and neither
    ``send_timeout`` nor ``max_queued_bytes`` sees it (0: the kernel's default)."""
    max_request_bytes: int = 1 << 20
    padding: str = "off"
    """``off``, ``bucket`` or ``constant``: pad SSE writes and Eloquent datagrams to a few sizes so an observer of
    the encrypted connection does not learn each token's length (``core.padding``, docs/SECURITY.md)."""
    send_tick: float = 0.0
    """Seconds: hold SSE writes and datagram flushes to multiples of this tick, so their timing follows the clock,
    not the tokens (0: off, send at once). The HTTP/3 front end passes it to each Eloquent sender
    (``SenderConfig.send_tick``, ``core.pacing``)."""
    drain_timeout: float = 30.0
    """Seconds a draining server (SIGTERM, ``POST /eloquent/drain``) lets its in-flight streams run before it
    hands them over (the store is told the producer is gone, clients resume elsewhere) and exits."""
    drain_token: str | None = None
    """``POST /eloquent/drain`` then needs ``Authorization: Bearer <token>``; without it, loopback only."""
    migrate: bool = True
    """A resume that finds the stream's producer gone (its replica killed or drained, its upstream dead) continues
    the generation on this replica's engine and splices it into the same stream (``core.continuation``); off: the
    stream ends uncompleted, as without migration."""
    limits: Limits = field(default_factory=Limits)

    def __post_init__(self) -> None:
        if self.stream_transport not in ("sse", "eloquent"):
            raise ConfigError(f"stream transport must be 'sse' or 'eloquent', got {self.stream_transport!r}")
        for name in ("resume_ttl", "resume_grace", "send_timeout", "header_timeout", "body_timeout",
                     "max_streams_per_client", "max_queued_bytes", "max_held_bytes", "socket_send_buffer",
                     "drain_timeout", "body_min_rate", "body_rate_grace", "max_body_bytes_per_connection",
                     "max_body_bytes_per_address", "max_request_bytes"):
            require_finite(name, getattr(self, name))
        check_settings(self)
        if self.eloquent_port is not None and not 0 <= self.eloquent_port <= 65535:
            raise ConfigError(f"eloquent_port must be a port number, got {self.eloquent_port}")
        KeepAlivePolicy(self.keepalive, self.keepalive_frame)  # validates both
        parse_mode(self.padding)
        check_tick(self.send_tick)

    @property
    def keepalive_policy(self) -> KeepAlivePolicy:
        return KeepAlivePolicy(self.keepalive, self.keepalive_frame)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> StreamConfig:
        """Build from ``ELOQUENT_<FIELD>`` variables (e.g. ``ELOQUENT_KEEPALIVE=5``), then ``overrides``."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            if f.name == "limits":
                continue
            raw = env.get(f"ELOQUENT_{f.name.upper()}")
            if raw is None or raw == "":
                continue
            values[f.name] = _parse(f.name, f.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]

    def replace(self, **changes: object) -> StreamConfig:
        return replace(self, **changes)  # type: ignore[arg-type]


def _parse(name: str, annotation: object, raw: str) -> object:
    text = str(annotation)
    try:
        if text.startswith("bool"):
            if raw.lower() in ("1", "true", "yes", "on"):
                return True
            if raw.lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        if text.startswith("float"):
            return float(raw)
        if text.startswith("int"):
            return int(raw)
    except ValueError:
        raise ConfigError(f"ELOQUENT_{name.upper()}={raw!r} is not a valid {text}") from None
    return raw


ENV_PREFIX = "ELOQUENT_"
PLUGIN_PREFIX = "eloquent-"
"""What an adapter puts in front of a shared flag name inside a host's own CLI (``vllm serve``)."""
UNPREFIXED = ("stream-transport",)
"""Shared names an adapter keeps as they are: the switch that turns the layer on, which no host flag clashes with."""


def env_name(flag: str) -> str:
    """The variable a setting reads: ``--keepalive`` -> ``ELOQUENT_KEEPALIVE`` (an adapter's prefixed spelling,
    ``--eloquent-keepalive``, reads the same one)."""
    name = flag.lstrip("-")
    if name.startswith(PLUGIN_PREFIX) and name != "eloquent-port":
        name = name[len(PLUGIN_PREFIX):]
    return ENV_PREFIX + name.replace("-", "_").upper()


def plugin_flag(flag: str) -> str:
    """A shared flag's spelling inside a host CLI: ``--keepalive`` -> ``--eloquent-keepalive``; names that already
    start with ``eloquent-`` (``--eloquent-port``) and the ``--stream-transport`` switch stay as they are."""
    name = flag.lstrip("-")
    if name.startswith(PLUGIN_PREFIX) or name in UNPREFIXED:
        return f"--{name}"
    return f"--{PLUGIN_PREFIX}{name}"


