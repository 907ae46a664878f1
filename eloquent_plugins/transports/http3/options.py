"""The HTTP/3 front end's own settings (``FrontEndOptions``: transport details beyond ``StreamConfig``), a leaf
that the server, every connection and the CLI read without importing the server."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

from eloquent_plugins.core.codecs.router import CodecRouter
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.quic_lb import QuicLbConfig
from eloquent_plugins.h3glue.listener import RETRY_MODES
from eloquent_plugins.transports.cors import OriginPolicy, parse_origins


@dataclass(frozen=True, slots=True)
class FrontEndOptions:
    """Transport details beyond ``StreamConfig`` (defaults suit loopback demos and real paths alike)."""

    idle_timeout: float = 60.0
    """QUIC idle timeout; must exceed any outage a stream should survive. Also how long a connection may carry no
    request or session: then it is closed (H3_NO_ERROR), however often the client PINGs."""
    fallback_after: float = 1.0
    """Seconds after the trailer before still-unacked events go on the reliable stream."""
    record_timings: bool = False
    """Keep each SSE event's generation time per request (benchmarks read them back in-process)."""
    timings_kept: int = 1024
    sender_redundancy: str | int | None = None
    """``SenderConfig.redundancy`` of Eloquent-scheme streams (``bench e2e --redundancy``); None: the default."""
    congestion_control: str = "reno"
    pacing: bool = False
    """aioquic's pacer (see ``h3glue.common.NoPacer`` for why it is off by default for token streams)."""
    codec_router: CodecRouter | None = None
    """Which codec shapes the JSON errors of each route; None: the plugin manager's codecs (the built-in ones
    without a manager) on the default routes, as the SSE middleware does."""
    retry: str = "auto"
    """Stateless Retry (address validation, one extra round trip): "auto" when ``retry_threshold`` handshakes
    are under way or one address has ``max_handshakes_per_address``, "always", or "off" (past a cap: dropped)."""
    retry_threshold: int = 64
    max_handshakes: int = 512
    """Connections still in the handshake, in all; past it new ones are dropped (old ones are kept)."""
    max_handshakes_per_address: int = 16
    """Handshakes not yet address-validated from one IP address; past it a Retry ("auto") or a drop ("off")."""
    handshake_timeout: float = 10.0
    """A connection whose handshake is not complete by then is dropped, nothing sent (not kept ``idle_timeout``)."""
    max_connections: int = 2048
    """QUIC connections held at once, handshaking or open (each costs about 96 KiB): at it, the one idle longest
    (no request for a second or more) is closed with H3_EXCESSIVE_LOAD for a newcomer, else the newcomer is
    refused (CONNECTION_REFUSED); a connection carrying a request is never closed for a newcomer."""
    max_connections_per_address: int = 128
    """The same, from one IP address (the address's own idle connections are closed first)."""
    webtransport_path: str | None = "/eloquent/wt"
    """Where browsers open WebTransport sessions (docs/BROWSER.md; the JS client's default path too); None or ""
    turns WebTransport off."""
    cors_origins: tuple[str, ...] = ()
    """Page origins besides the same-origin ones that may open WebTransport sessions (``--cors-origin``, ``*``:
    any); another origin's session gets 403 (browsers apply no CORS to WebTransport)."""
    page_ports: tuple[int, ...] = ()
    """TCP ports on the same host whose pages count as same-origin (the port pages are served from, when the
    HTTP/3 port differs or the browser reaches this port through a relay)."""
    server_id: bytes | None = None
    """``--server-id``: every connection id issued carries it in the QUIC-LB layout (``core.quic_lb``), so a
    balancer that routes by connection id keeps a connection on this replica; None: aioquic's random ids."""

    @property
    def quic_lb(self) -> QuicLbConfig | None:
        return QuicLbConfig(self.server_id) if self.server_id else None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> FrontEndOptions:
        """Defaults, then ``ELOQUENT_QUIC_<FIELD>`` variables for the QUIC fields (``ELOQUENT_QUIC_RETRY``,
        ``ELOQUENT_QUIC_HANDSHAKE_TIMEOUT``, ``ELOQUENT_QUIC_IDLE_TIMEOUT``, ...), then ``overrides``."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in ENV_FIELDS or (raw := env.get(f"ELOQUENT_QUIC_{f.name.upper()}")) is None:
                continue
            kind = ENV_FIELDS[f.name]
            try:
                values[f.name] = kind(raw)
            except ValueError:
                raise ConfigError(f"ELOQUENT_QUIC_{f.name.upper()}={raw!r} is not a valid {kind.__name__}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return replace(cls(), **values)

    def origin_policy(self) -> OriginPolicy:
        return OriginPolicy(parse_origins(self.cors_origins), tuple(self.page_ports))

    def check(self) -> None:
        if not (self.idle_timeout > 0 and self.fallback_after > 0 and self.handshake_timeout > 0):
            raise ConfigError("idle_timeout, fallback_after and handshake_timeout must be > 0")
        if self.retry not in RETRY_MODES:
            raise ConfigError(f"retry must be one of {', '.join(RETRY_MODES)}, not {self.retry!r}")
        if min(self.retry_threshold, self.max_handshakes, self.max_handshakes_per_address) < 1:
            raise ConfigError("retry_threshold, max_handshakes and max_handshakes_per_address must be >= 1")
        if min(self.max_connections, self.max_connections_per_address) < 1:
            raise ConfigError("max_connections and max_connections_per_address must be >= 1")
        if self.webtransport_path and not self.webtransport_path.startswith("/"):
            raise ConfigError(f"webtransport_path must start with /, not {self.webtransport_path!r}")


ENV_FIELDS: dict[str, Callable[[str], Any]] = {
    "idle_timeout": float, "handshake_timeout": float, "retry": str, "retry_threshold": int,
    "max_handshakes": int, "max_handshakes_per_address": int, "max_connections": int,
    "max_connections_per_address": int, "webtransport_path": str}
"""FrontEndOptions fields ``from_env`` reads (``ELOQUENT_QUIC_<NAME>``)."""
