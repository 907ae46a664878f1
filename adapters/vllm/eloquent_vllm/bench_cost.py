"""What the vLLM adapter's ASGI stack adds to requests that do not use it, in-process (issue 16 item 4).

Why in-process: on a live vLLM server the plugin's cost on bypassed requests (well under 1% of the API server's
CPU per token) is far inside the paired-round spread of a shared 2-core machine; here it is timed exactly.
``VllmStreamMiddleware(app)`` (as vLLM's ``--middleware`` builds it, ``--stream-transport sse``) around a stand-in
app that answers with ``messages`` body messages, against the bare app: CPU per request with the bypass header
(``eloquent-transport: datagram``: vLLM's own streaming, passed through), and per non-streamed request (a JSON
answer, which goes through the SSE middleware's pass-through). Run it with vLLM's venv or ours:
``python -m eloquent_vllm.bench_cost [--messages 256] [--requests 2000]``.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from argparse import Namespace
from types import SimpleNamespace
from typing import Any

from eloquent_plugins.core.protocol import DATAGRAM, TRANSPORT_HEADER
from eloquent_plugins.transports.asgi import ASGIApp, Message, Receive, Send

EVENT = b'data: {"id":"x","choices":[{"delta":{"content":"tok"}}]}\n\n'


def stand_in_app(messages: int, content_type: bytes) -> ASGIApp:
    async def app(scope: Any, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
        for _ in range(messages):
            await send({"type": "http.response.body", "body": EVENT, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


async def _sink(message: Message) -> None:
    return None


async def _receive() -> Message:
    return {"type": "http.request", "body": b"{}", "more_body": False}


async def cpu_per_request_us(asgi: ASGIApp, outer: Any, *, bypass: bool, requests: int) -> float:
    headers = [(b"host", b"bench"), (b"content-type", b"application/json")]
    if bypass:
        headers.append((TRANSPORT_HEADER, DATAGRAM))
    start = time.process_time()
    for _ in range(requests):
        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": headers,
                 "query_string": b"", "app": outer}
        await asgi(scope, _receive, _sink)
    return (time.process_time() - start) / requests * 1e6


async def measure(messages: int = 256, requests: int = 2000, repeat: int = 7) -> dict[str, float]:
    """Median added CPU (us) per request and (bypass) per event of the adapter stack over the bare app."""
    from eloquent_vllm.middleware import VllmStreamMiddleware  # same package

    outer = SimpleNamespace(state=SimpleNamespace(args=Namespace(stream_transport="sse", eloquent_keepalive=15.0,
                                                                 host="127.0.0.1", port=8000)))
    out: dict[str, float] = {"messages": messages}
    for label, bypass, app in (("bypass", True, stand_in_app(messages, b"text/event-stream")),
                               ("non_streamed", False, stand_in_app(1, b"application/json"))):
        wrapped = VllmStreamMiddleware(app)
        bare, through = [], []
        for _ in range(repeat):
            bare.append(await cpu_per_request_us(app, outer, bypass=bypass, requests=requests))
            through.append(await cpu_per_request_us(wrapped, outer, bypass=bypass, requests=requests))
        out[f"{label}_bare_us_per_request"] = statistics.median(bare)
        out[f"{label}_added_us_per_request"] = statistics.median(through) - statistics.median(bare)
    out["bypass_added_ns_per_event"] = out["bypass_added_us_per_request"] / messages * 1000
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eloquent_vllm.bench_cost", description=__doc__)
    parser.add_argument("--messages", type=int, default=256, help="body messages (events) per bypassed request")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args(argv)
    r = asyncio.run(measure(args.messages, args.requests, args.repeat))
    print(f"bypass ({args.messages} events/request): bare {r['bypass_bare_us_per_request']:.1f} us/request, "
          f"adapter adds {r['bypass_added_us_per_request']:.2f} us/request = "
          f"{r['bypass_added_ns_per_event']:.0f} ns/event")
    print(f"non-streamed: bare {r['non_streamed_bare_us_per_request']:.1f} us/request, adapter adds "
          f"{r['non_streamed_added_us_per_request']:.2f} us/request")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
