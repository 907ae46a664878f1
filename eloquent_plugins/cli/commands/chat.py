"""``eloquent chat``: stream one answer live in the terminal, then print its stall statistics.

Without ``--url`` it starts the built-in engine and the HTTP/3 front end in this process (and the lossy relay
when ``--loss`` or ``--rtt`` is given), so the statistics include the real stall ratio, computed from the
server's generation times. Against a remote ``--url`` only the client's view exists: render gaps.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import logging
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

from eloquent_plugins.cli import numbers
from eloquent_plugins.cli.flags import add_duration
from eloquent_plugins.core.errors import ConfigError, EloquentError
from eloquent_plugins.core.stall import percentile, stall_metrics


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("chat", help="stream an answer live in the terminal, with stall statistics",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("prompt", nargs="?", default="Tell me a story.", help="what to ask")
    parser.add_argument("--url", default=None, help="server base URL, e.g. https://127.0.0.1:8000 (default: an "
                        "in-process built-in engine)")
    parser.add_argument("--transport", choices=("auto", "eloquent", "h3-stream", "sse"), default="auto",
                        help="auto: HTTP/3 datagrams when UDP answers, else SSE over TCP; eloquent: HTTP/3 "
                        "datagrams; h3-stream: SSE on the HTTP/3 stream; sse: HTTP/1.1 (default: %(default)s)")
    parser.add_argument("--h3-port", type=numbers.port, default=None, metavar="UDP_PORT",
                        help="UDP port of HTTP/3 (default: the server's Alt-Svc, else the URL's port number)")
    parser.add_argument("--h3-probe-timeout", type=numbers.positive_seconds, default=0.1, metavar="SECONDS",
                        help="auto: QUIC's head start before TCP races it (a stream that began on TCP moves to "
                        "datagrams when QUIC is up) (default: %(default)s)")
    parser.add_argument("--stream-idle-timeout", type=numbers.positive_seconds, default=3.0, metavar="SECONDS",
                        help="HTTP/3: silence after which the path is taken for dead and the stream resumed "
                        "(default: %(default)s)")
    parser.add_argument("--scheme", choices=("eloquent", "duplicate"), default=None,
                        help="datagram scheme to ask for (default: eloquent)")
    parser.add_argument("--insecure", action="store_true", help="do not verify the server certificate")
    parser.add_argument("--cafile", default=None, help="CA or certificate file to verify the server with")
    parser.add_argument("--model", default=None, help="model name (default: the server's first model)")
    parser.add_argument("--max-tokens", type=numbers.positive, default=200, help="(default: %(default)s)")
    add_duration(parser, "--pace", default=None, old_ms="--pace-ms",
                 help="release text at most one event per this many seconds (client-side pacing; default: off)")
    parser.add_argument("--timeout", type=numbers.positive_seconds, default=10.0,
                        help="seconds to connect and to get the response "
                        "headers (default: %(default)s)")
    parser.add_argument("--loss", type=numbers.loss_rate, default=0.0, help="in-process only: relay loss rate")
    parser.add_argument("--burst", type=numbers.burst, default=2.0, help="in-process only: mean loss burst")
    add_duration(parser, "--rtt", default=0.0, old_ms="--rtt-ms",
                 help="in-process only: relay round-trip time (default: %(default)s)")
    parser.set_defaults(func=run)


@contextlib.asynccontextmanager
async def _local(args: argparse.Namespace) -> AsyncIterator[tuple[str, Any, float]]:
    """In-process engine + front end (+ relay): yields (url, server, one-way delay)."""
    from eloquent_plugins.cli.harness import Conditions, Workload, harness

    conditions = Conditions(loss=args.loss, burst=args.burst, rtt=args.rtt)
    async with harness(conditions, Workload(requests=1, max_tokens=args.max_tokens)) as h:
        url = h.relay_url if (args.loss > 0 or args.rtt > 0) else h.direct_url
        yield url, h.server, conditions.one_way


async def _chat(args: argparse.Namespace, out: Any) -> int:
    from eloquent_client import EloquentClient, Pacing

    verify: bool | str = args.cafile or not args.insecure
    pacing = Pacing(interval=args.pace, max_lag=2.0) if args.pace else None
    async with contextlib.AsyncExitStack() as stack:
        server = None
        one_way = 0.0
        url = args.url
        if url is None:
            url, server, one_way = await stack.enter_async_context(_local(args))
            verify = False
        client = EloquentClient(url, transport=args.transport, scheme=args.scheme, verify=verify, pacing=pacing,
                                timeout=args.timeout, h3_port=args.h3_port, h3_probe_timeout=args.h3_probe_timeout,
                                stream_idle_timeout=args.stream_idle_timeout)
        stack.push_async_callback(client.aclose)
        model = args.model
        if model is None:
            models = await client.request("GET", "/v1/models")
            data = models.json().get("data") if models.status == 200 else None
            model = data[0]["id"] if data else "default"
        body = {"model": model, "stream": True, "max_tokens": args.max_tokens,
                "messages": [{"role": "user", "content": args.prompt}]}
        started = time.monotonic()
        rendered: list[float] = []
        async with client.stream("POST", "/v1/chat/completions", json=body) as s:
            async for event in s.events():
                rendered.append(event.rendered_at)
                if event.error is not None:
                    out.write(f"\n[server error: {event.error}]\n")
                elif event.text:
                    out.write(event.text)
                    out.flush()
            request_id, delivery = s.request_id, " then ".join(s.deliveries).replace("datagram", "eloquent")
        out.write("\n\n")
        _stats(out, started, rendered, delivery, server.generation_times(request_id) if server and request_id
               else None, one_way)
    return 0


def _stats(out: Any, started: float, rendered: list[float], delivery: str, generated: list[float] | None,
           one_way: float) -> None:
    if not rendered:
        out.write("no events\n")
        return
    gaps = [b - a for a, b in itertools.pairwise(rendered)]
    out.write(f"--- {len(rendered)} events via {delivery}; first after {rendered[0] - started:.2f} s, "
              f"total {rendered[-1] - started:.2f} s\n")
    out.write(f"    render gaps: p50 {percentile(gaps, 50) * 1000:.0f} ms, p99 {percentile(gaps, 99) * 1000:.0f} ms, "
              f"max {max(gaps, default=0) * 1000:.0f} ms, {sum(g > 0.25 for g in gaps)} over 250 ms\n")
    if generated is not None and len(generated) == len(rendered):
        d = max(0.0, min(r - g for g, r in zip(generated, rendered)))
        report = stall_metrics(generated, rendered, d)
        out.write(f"    stall ratio {report.stall_ratio:.1%} (stall {report.stall_time * 1000:.0f} ms of "
                  f"{report.duration:.2f} s; d = {d * 1000:.1f} ms, path one-way {one_way * 1000:.0f} ms), "
                  f"lateness p95 {report.lateness_p95 * 1000:.0f} ms, max {report.lateness_max * 1000:.0f} ms\n")


def run(args: argparse.Namespace) -> int:
    import httpx

    if args.url is None and args.transport == "sse":
        raise ConfigError("--transport sse needs --url: the in-process server has only the HTTP/3 side (start "
                          "`eloquent serve`, then --url http://127.0.0.1:8000)")
    # aioquic logs a refused certificate itself ("quic" logger, through logging's last-resort handler): the one
    # line below says it, with the flags that get past it.
    quic_log = logging.getLogger("quic")
    quiet = not quic_log.handlers and not logging.getLogger().handlers
    if quiet:
        quic_log.addHandler(logging.NullHandler())
        quic_log.propagate = False
    try:
        return asyncio.run(_chat(args, sys.stdout))
    except (OSError, httpx.TransportError, EloquentError) as exc:
        raise _unreachable(args.url, exc) from None
    finally:
        if quiet:
            quic_log.handlers.clear()
            quic_log.propagate = True


def _unreachable(url: str | None, exc: BaseException) -> EloquentError:
    """One line for a server that cannot be reached; https:// to the plain-HTTP TCP side says so; a refused
    certificate names this command's flags (not the client's ``verify=``)."""
    from eloquent_client import TLSVerificationError
    from eloquent_client.errors import dev_certificate_path

    if isinstance(exc, TLSVerificationError):
        return ConfigError(f"TLS verification of {exc.host}:{exc.port} failed: {exc.reason}. Pass --insecure "
                           f"(development only), or --cafile <the server's certificate or CA>; for `eloquent "
                           f"serve`'s development certificate: --cafile {dev_certificate_path()}")
    text = str(exc) if isinstance(exc, EloquentError) else \
        f"cannot reach {url or 'the server'}: {str(exc) or type(exc).__name__}"
    if url and url.startswith("https://") and "WRONG_VERSION_NUMBER" in text:
        text += (" (the TCP side of `eloquent serve` is plain HTTP unless it was started with --certfile: "
                 f"--url http://{url[len('https://'):]})")
    return exc if isinstance(exc, EloquentError) and text == str(exc) else ConfigError(text)
