"""The ``vllm serve`` flags this adapter adds, and the settings they resolve to.

Flags follow vLLM's style; each also reads an ``ELOQUENT_*`` variable through :meth:`StreamConfig.from_env`
(CLI beats environment beats default), so ``--api-server-count`` children and container setups that only pass
environment work too. Without ``--stream-transport`` (or ``ELOQUENT_STREAM_TRANSPORT``) nothing changes.
"""

from __future__ import annotations

import os
from argparse import ArgumentParser, Namespace
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from eloquent_vllm.errors import ServeOptionsError

if TYPE_CHECKING:
    from eloquent_plugins.transports.config import StreamConfig

Transport = Literal["none", "sse", "eloquent"]
TRANSPORTS: tuple[Transport, ...] = ("none", "sse", "eloquent")
MIDDLEWARE_PATH = "eloquent_vllm.middleware.VllmStreamMiddleware"
"""What the parser hook appends to vLLM's ``--middleware`` list."""
TRANSPORT_ENV = "ELOQUENT_STREAM_TRANSPORT"
GROUP_TITLE = "Eloquent streaming (eloquent-plugins)"


SHARED_FLAGS: tuple[tuple[str, dict[str, object], str], ...] = (
    ("--stream-transport", {"choices": TRANSPORTS},
     "sse: keep-alive + resumable SSE on the streaming routes; eloquent: also an HTTP/3 (QUIC) front end on a UDP "
     "port serving the same app; none (default): vLLM unchanged."),
    ("--eloquent-port", {"type": int, "metavar": "UDP_PORT"},
     "UDP port of the HTTP/3 front end (only with --stream-transport eloquent; default: the same number as --port)."),
    ("--keepalive", {"type": float, "metavar": "SECONDS"},
     "Send an SSE keep-alive after this many idle seconds; 0 turns it off (default 15)."),
    ("--resume-store", {"metavar": "URL"},
     "Where resumable streams are kept: memory:// (one process, default) or redis://host:port/db (needed with "
     "--api-server-count > 1)."),
    ("--no-resume", {"action": "store_true"}, "Turn off event ids and resume."),
    ("--migrate", {"choices": ("on", "off")}, "on (default): a resume that finds its stream's producer gone "
     "continues the generation on this server and splices it into the same stream; off: it ends uncompleted."),
    ("--body-timeout", {"type": float, "metavar": "SECONDS"},
     "Answer 408 when a request body stalls this long; 0 turns it off (default 30)."),
    ("--max-streams-per-client", {"type": int, "metavar": "N"},
     "Live SSE streams one caller may hold; above it 429; 0 = unlimited (default)."),
    ("--padding", {"choices": ("off", "bucket", "constant")},
     "Pad SSE writes and Eloquent datagrams to a few sizes against size side channels: off (default), bucket "
     "(size classes ~1.25x apart for SSE, 1.5x for datagrams) or constant (docs/SECURITY.md)."),
    ("--send-tick", {"type": float, "metavar": "SECONDS"},
     "Send SSE writes and HTTP/3 Eloquent datagrams only at multiples of this tick, against timing side "
     "channels (adds up to one tick of latency); 0 = off (default)."),
    ("--drain-timeout", {"type": float, "metavar": "SECONDS"},
     "POST /eloquent/drain (loopback, or ELOQUENT_DRAIN_TOKEN): /ready turns 503, new streams get 503 + "
     "Retry-After, streams in flight run on this long, then are handed over (default 30)."),
    ("--certfile", {"metavar": "PEM"}, "TLS certificate for HTTP/3 (default: --ssl-certfile, which also makes "
     "vLLM's TCP side HTTPS: the same files on both)."),
    ("--keyfile", {"metavar": "PEM"}, "TLS private key for HTTP/3 (default: --ssl-keyfile)."),
)
"""``eloquent serve``'s names for the settings this adapter takes; each is added as :func:`plugin_flag` spells it
(``--keepalive`` -> ``--eloquent-keepalive``) and reads the same ``ELOQUENT_*`` variable (docs/FLAGS.md)."""


def add_eloquent_args(parser: ArgumentParser) -> bool:
    """Add our flags to a ``vllm serve`` parser once; False if they (or a same-named vLLM flag) already exist."""
    from eloquent_plugins.transports.config import env_name, plugin_flag

    if "--stream-transport" in parser._option_string_actions:
        return False
    group = parser.add_argument_group(
        GROUP_TITLE,
        "Robust token streaming. Every flag also reads the ELOQUENT_* variable named in its help "
        "(command line beats environment beats default).",
    )
    for name, options, text in SHARED_FLAGS:
        group.add_argument(plugin_flag(name), default=None, help=f"{text} [{env_name(name)}]", **options)
    return True


@dataclass(frozen=True)
class EloquentVllmSettings:
    """Resolved adapter settings for one vLLM server (``config`` is None when the transport is ``none``)."""

    transport: Transport
    config: StreamConfig | None
    http3_host: str
    http3_port: int | None

    @property
    def enabled(self) -> bool:
        return self.transport != "none"

    @property
    def wants_http3(self) -> bool:
        return self.transport == "eloquent"

    @classmethod
    def from_namespace(
        cls,
        ns: Namespace,
        environ: Mapping[str, str] | None = None,
        default_transport: Transport = "none",
    ) -> EloquentVllmSettings:
        """Resolve from vLLM's parsed args; ``default_transport`` applies when neither flag nor env names one."""
        env = os.environ if environ is None else environ
        transport = getattr(ns, "stream_transport", None) or env.get(TRANSPORT_ENV) or default_transport
        if transport not in TRANSPORTS:
            raise ServeOptionsError(f"{TRANSPORT_ENV}={transport!r}: choose one of {', '.join(TRANSPORTS)}")
        host = getattr(ns, "host", None) or "0.0.0.0"
        if transport == "none":
            return cls("none", None, host, None)

        # Imported here: light (config only, no transports) but not needed when the transport is "none".
        from eloquent_plugins.transports.config import StreamConfig

        config = StreamConfig.from_env(
            env,
            stream_transport=transport,
            keepalive=getattr(ns, "eloquent_keepalive", None),
            resume_store=getattr(ns, "eloquent_resume_store", None),
            eloquent_port=getattr(ns, "eloquent_port", None),
            certfile=getattr(ns, "eloquent_certfile", None),
            keyfile=getattr(ns, "eloquent_keyfile", None),
            body_timeout=getattr(ns, "eloquent_body_timeout", None),
            max_streams_per_client=getattr(ns, "eloquent_max_streams_per_client", None),
            padding=getattr(ns, "eloquent_padding", None),
            send_tick=getattr(ns, "eloquent_send_tick", None),
            drain_timeout=getattr(ns, "eloquent_drain_timeout", None),
            resume=False if getattr(ns, "eloquent_no_resume", None) or _truthy(env.get("ELOQUENT_NO_RESUME")) else None,
            migrate=None if getattr(ns, "eloquent_migrate", None) is None else ns.eloquent_migrate == "on",
        )
        if config.certfile is None and config.keyfile is None and getattr(ns, "ssl_certfile", None):
            config = config.replace(certfile=ns.ssl_certfile, keyfile=getattr(ns, "ssl_keyfile", None))
        port = config.eloquent_port
        if port is None and not getattr(ns, "uds", None):
            port = getattr(ns, "port", None)
        if port is not None and port != config.eloquent_port:
            config = config.replace(eloquent_port=port)
        return cls(transport, config, host, port if transport == "eloquent" else None)

    def check_serving(self, ns: Namespace, environ: Mapping[str, str] | None = None) -> None:
        """Refuse flag combinations we cannot serve correctly, with a message that says what to do instead."""
        if not self.enabled or self.config is None:
            return
        env = os.environ if environ is None else environ
        flag = f"--stream-transport {self.transport}"
        if env.get("VLLM_USE_RUST_FRONTEND", "0").lower() not in ("", "0", "false"):
            raise ServeOptionsError(f"{flag} needs vLLM's Python API server; unset VLLM_USE_RUST_FRONTEND")
        if getattr(ns, "grpc", False):
            raise ServeOptionsError(f"{flag} applies to the HTTP server, not --grpc")
        if not self.wants_http3 and getattr(ns, "eloquent_port", None) is not None:
            raise ServeOptionsError(f"--eloquent-port is the HTTP/3 front end's UDP port: it needs --stream-transport "
                                    f"eloquent, not {self.transport}")
        # The middleware makes its store on the first request: refuse a URL no installed store takes now.
        from eloquent_plugins.transports.resume import check_resume_store

        check_resume_store(self.config)
        servers = planned_api_servers(ns)
        if self.wants_http3:
            if servers > 1:
                raise ServeOptionsError(
                    f"{flag} runs its HTTP/3 front end in the API server process, so it supports one API server; "
                    f"got {servers} (--api-server-count / data parallel size). Use --api-server-count 1, or "
                    "--stream-transport sse, which works with several API servers."
                )
            if self.http3_port is None:
                raise ServeOptionsError(f"{flag} with --uds needs an explicit --eloquent-port (UDP)")
            if (self.config.certfile is None) != (self.config.keyfile is None):
                raise ServeOptionsError("--eloquent-certfile and --eloquent-keyfile must be given together")
        if servers > 1 and self.config.resume and self.config.resume_store.startswith("memory://"):
            raise ServeOptionsError(
                f"{flag} with {servers} API server processes needs a shared resume store: a reconnect may reach "
                "another process, which cannot see a memory:// store. Pass --eloquent-resume-store "
                "redis://HOST:PORT/DB, or run one API server."
            )


def _truthy(raw: str | None) -> bool:
    return raw is not None and raw.strip().lower() in ("1", "true", "yes", "on")


def planned_api_servers(ns: Namespace) -> int:
    """How many API server processes ``vllm serve`` will start (mirrors its defaulting; 0 when headless)."""
    count = getattr(ns, "api_server_count", None)
    if count is not None:
        return int(count)
    if getattr(ns, "headless", False):
        return 0
    external = (
        getattr(ns, "data_parallel_external_lb", False)
        or getattr(ns, "data_parallel_rank", None) is not None
        or getattr(ns, "data_parallel_multi_port_external_lb", False)
    )
    if external:
        return 1
    if getattr(ns, "data_parallel_hybrid_lb", False) or getattr(ns, "data_parallel_start_rank", None) is not None:
        return int(getattr(ns, "data_parallel_size_local", None) or 1)
    return int(getattr(ns, "data_parallel_size", 1) or 1)
