"""The server settings' one vocabulary: ``eloquent serve`` declares them here, the vLLM plugin spells the same
names with ``--eloquent-`` in front (:func:`eloquent_plugins.transports.config.plugin_flag`), and every one reads
``ELOQUENT_<FLAG>`` (CLI > environment > default; the machinery is :mod:`eloquent_plugins.cli.flags`)."""

from __future__ import annotations

import argparse
import socket

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.flags import add_setting
from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.padding import MODES

TRANSPORTS = ("none", "sse", "eloquent")
"""Every command and adapter offers the same three: none = the app as it is, without the streaming layer."""
_D = StreamConfig()


def add_host_port(parser: argparse.ArgumentParser, *, port: int = 8000) -> None:
    add_setting(parser, "--host", default="127.0.0.1", help="address to bind")
    add_setting(parser, "--port", type=numbers.port, default=port,
                help="TCP port for HTTP/SSE; the HTTP/3 front end uses the same number over UDP unless "
                "--eloquent-port says otherwise; 0 picks one number free on both")


def add_keepalive(parser: argparse.ArgumentParser) -> None:
    add_setting(parser, "--keepalive", type=numbers.seconds, default=_D.keepalive, metavar="SECONDS",
                help="seconds without bytes before a keep-alive; 0 turns it off")


def add_stream_transport(parser: argparse.ArgumentParser, *, default: str = "eloquent") -> None:
    add_setting(parser, "--stream-transport", choices=TRANSPORTS, default=default,
                help="none: the app as it is; sse: keep-alive, resume and coalescing on the SSE path; eloquent: "
                "also the HTTP/3 datagram front end on UDP")


def add_upstream(parser: argparse.ArgumentParser) -> None:
    add_setting(parser, "--upstream", metavar="KIND=URL", default=None, shown="the built-in engine",
                help="model server to front, e.g. tgi=http://127.0.0.1:3000 or triton=grpc://127.0.0.1:8001")


def add_server_settings(parser: argparse.ArgumentParser) -> None:
    """The stream layer's settings, the ones the vLLM plugin also takes (prefixed)."""
    add_setting(parser, "--eloquent-port", type=numbers.port, default=None, metavar="UDP_PORT",
                shown="the --port number", help="UDP port of the HTTP/3 front end (only with --stream-transport "
                "eloquent)")
    add_setting(parser, "--certfile", default=None, metavar="PEM", shown="plain HTTP; HTTP/3 uses a generated "
                "development certificate", help="TLS certificate: HTTPS on TCP and HTTP/3 on UDP from the same files")
    add_setting(parser, "--keyfile", default=None, metavar="PEM", shown="the key in --certfile",
                help="TLS private key for --certfile")
    add_setting(parser, "--resume-store", default=_D.resume_store, metavar="URL",
                help="memory:// or redis://host:port/db to share resumable streams across replicas")
    add_setting(parser, "--no-resume", action="store_true", default=False, help="turn off event ids and resume")
    add_setting(parser, "--migrate", choices=("on", "off"), default="on" if _D.migrate else "off",
                help="a resume that finds its stream's producer gone (replica killed or drained, upstream dead) "
                "continues the generation here and splices it into the same stream; off: the stream ends "
                "uncompleted")
    add_setting(parser, "--body-timeout", type=numbers.seconds, default=_D.body_timeout, metavar="SECONDS",
                help="answer 408 and stop the request when its body stalls this long, HTTP/1.1 and HTTP/3; "
                "0 turns it off")
    add_setting(parser, "--body-min-rate", type=numbers.count, default=_D.body_min_rate, metavar="BYTES_PER_S",
                help="a request body (or WebTransport request head) must keep up this many bytes/s once "
                "--body-rate-grace is over, bytes sent ahead counting for at most --body-timeout; slower: 408, "
                "HTTP/1.1 and HTTP/3; 0 turns it off")
    add_setting(parser, "--body-rate-grace", type=numbers.seconds, default=_D.body_rate_grace, metavar="SECONDS",
                help="seconds from a request's head before --body-min-rate applies")
    add_setting(parser, "--max-body-bytes-per-connection", type=numbers.count,
                default=_D.max_body_bytes_per_connection, metavar="BYTES",
                help="bytes of incomplete request bodies and WebTransport heads one connection may have the server "
                "hold at once; past it 429 (413 for one body alone over it); 0 = unlimited")
    add_setting(parser, "--max-body-bytes-per-address", type=numbers.count, default=_D.max_body_bytes_per_address,
                metavar="BYTES", help="the same over all connections from one client address (behind a proxy: the "
                "proxy's); 0 = unlimited. All of them together may take a quarter of the memory budget (then 503)")
    add_setting(parser, "--max-streams-per-client", type=numbers.count, default=_D.max_streams_per_client,
                metavar="N", help="live SSE streams one caller (credentials, else client IP) may hold; above it "
                "429; 0 = unlimited")
    add_setting(parser, "--padding", choices=MODES, default=_D.padding,
                help="pad SSE writes (a comment line) and Eloquent datagrams (zero bytes) to a few sizes so an "
                "observer of the encrypted connection cannot read token lengths: bucket = size classes ~1.25x "
                "(SSE) or 1.5x (datagrams) apart, constant = one size (docs/SECURITY.md)")
    add_setting(parser, "--send-tick", type=numbers.seconds, default=_D.send_tick, metavar="SECONDS",
                help="send only at multiples of this tick, so send times follow the clock rather than the tokens: SSE "
                "writes (events that come meanwhile go in one write) and HTTP/3 Eloquent datagrams (new events, "
                "probes and keep-alives alike); adds up to one tick of latency; 0 = off")
    add_setting(parser, "--drain-timeout", type=numbers.seconds, default=_D.drain_timeout, metavar="SECONDS",
                help="on SIGTERM or POST /eloquent/drain: /ready turns 503, new streams get 503 + Retry-After, "
                "streams in flight run on this long, then are handed over (clients resume on another replica) "
                "and the server exits")
    add_setting(parser, "--cors-origin", default=None, metavar="ORIGINS", shown="no CORS headers",
                help="let browser pages on these origins (comma-separated, or *) call the API: answers preflights "
                "and exposes the x-eloquent-stream header")


def add_all(parser: argparse.ArgumentParser, *, port: int = 8000, transport: str = "eloquent") -> None:
    add_host_port(parser, port=port)
    add_keepalive(parser)
    add_stream_transport(parser, default=transport)
    add_upstream(parser)


def stream_config(args: argparse.Namespace, **overrides: object) -> StreamConfig:
    """The shared settings (already resolved CLI > environment > default) over ``StreamConfig.from_env``."""
    values: dict[str, object] = {}
    for name in ("keepalive", "eloquent_port", "certfile", "keyfile", "resume_store", "header_timeout",
                 "body_timeout", "body_min_rate", "body_rate_grace", "max_body_bytes_per_connection",
                 "max_body_bytes_per_address", "max_streams_per_client", "padding", "send_tick", "drain_timeout"):
        if getattr(args, name, None) is not None:
            values[name] = getattr(args, name)
    transport = getattr(args, "stream_transport", None)
    if transport is not None:
        values["stream_transport"] = "sse" if transport == "none" else transport
    if getattr(args, "no_resume", False):
        values["resume"] = False
    if getattr(args, "migrate", None) is not None:
        values["migrate"] = args.migrate == "on"
    values.update(overrides)
    try:
        return StreamConfig.from_env(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from None


def check_combination(args: argparse.Namespace) -> None:
    """Refuse settings that would be silently ignored."""
    if getattr(args, "eloquent_port", None) is not None and args.stream_transport != "eloquent":
        raise ConfigError(f"--eloquent-port (ELOQUENT_ELOQUENT_PORT) is the HTTP/3 front end's UDP port: it needs "
                          f"--stream-transport eloquent, not {args.stream_transport}")
    if getattr(args, "keyfile", None) is not None and getattr(args, "certfile", None) is None:
        raise ConfigError("--keyfile needs --certfile")


def free_port_pair(host: str, attempts: int = 50) -> int:
    """One port number free on both TCP and UDP at ``host`` (``--port 0``: clients rely on one number)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(attempts):
        with socket.socket(family, socket.SOCK_STREAM) as tcp:
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            tcp.bind((host, 0))
            port = tcp.getsockname()[1]
            with socket.socket(family, socket.SOCK_DGRAM) as udp:
                try:
                    udp.bind((host, port))
                except OSError:
                    continue
                return int(port)
    raise ConfigError(f"no port number free on both TCP and UDP at {host} after {attempts} tries")
