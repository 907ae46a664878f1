"""One run of streamed chat completions over HTTP/3 Eloquent datagrams, shaped like ``overhead_live.run_level``.

Why a separate runner: the HTTP/1.1 client of :mod:`.lighthttp` cannot speak QUIC; this one uses
``eloquent_client`` (one QUIC connection per concurrent worker, opened by its first request, like the HTTP/1.1
runs). Each response must arrive as datagrams (``ResponseStream.delivery == "eloquent"``) and carry the usage
chunk's ``completion_tokens`` equal to ``max_tokens``; completeness is the transport's own reliable trailer
(event count + digest), so no ``[DONE]`` is required.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from typing import Any

from eloquent_plugins.cli.bench.overhead_request import request_body


async def _one(client: Any, body: bytes, max_tokens: int) -> tuple[int, float | None, bool, str | None, int]:
    """(tokens, time to first token, came as datagrams, error, events) of one streamed request."""
    from eloquent_client import ClientError

    from eloquent_plugins.core.errors import EloquentError

    start = time.perf_counter()
    first: float | None = None
    tokens: int | None = None
    events = 0
    try:
        async with client.stream("POST", "/v1/chat/completions", content=body,
                                 headers={"content-type": "application/json"}) as resp:
            datagrams = resp.delivery == "eloquent"
            async for event in resp.events():
                events += 1
                if event.kind == "error":
                    return 0, first, datagrams, f"in-band error: {event.data[:200]}", events
                if first is None and event.text:
                    first = time.perf_counter() - start
                if '"completion_tokens"' in event.data:
                    tokens = int(json.loads(event.data)["usage"]["completion_tokens"])
    except (ClientError, EloquentError, OSError, TimeoutError, ValueError, KeyError) as exc:
        return 0, first, False, f"{type(exc).__name__}: {exc}"[:200], events
    if tokens is None:
        return 0, first, datagrams, "no usage.completion_tokens in the stream", events
    if tokens != max_tokens:
        return 0, first, datagrams, f"completion_tokens {tokens} != max_tokens {max_tokens}", events
    return tokens, first, datagrams, None, events


async def run_level_h3(udp_port: int, model: str, max_tokens: int, concurrency: int, requests: int, *,
                       name: str = "h3", timeout: float = 600.0) -> dict[str, Any]:
    """``requests`` streamed chat completions over HTTP/3 datagrams to ``127.0.0.1:udp_port``, ``concurrency``
    at a time; the same keys as ``overhead_live.run_level`` (``via_middleware`` counts datagram deliveries)."""
    from eloquent_client import EloquentClient

    todo = iter([request_body(model, max_tokens, True, i) for i in range(requests)])
    outcomes: list[tuple[int, float | None, bool, str | None, int]] = []

    async def worker() -> None:
        async with EloquentClient(f"https://127.0.0.1:{udp_port}", transport="eloquent", verify=False,
                                  timeout=timeout) as client:
            for body in todo:
                outcomes.append(await _one(client, body, max_tokens))

    cpu0 = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    tokens = sum(o[0] for o in outcomes)
    errors = [o[3] for o in outcomes if o[3]]
    ttfts = [o[1] for o in outcomes if o[1] is not None and not o[3]]
    out: dict[str, Any] = {
        "mode": name, "stream": True, "concurrency": concurrency, "requests": requests, "tokens": tokens,
        "seconds": wall, "tokens_per_s": tokens / wall if wall else 0.0, "errors": len(errors),
        "client_cpu_s": cpu, "events": sum(o[4] for o in outcomes if not o[3]),
        "via_middleware": sum(o[2] for o in outcomes), "id_lines": 0}
    if errors:
        out["error_sample"] = errors[0]
    if ttfts:
        out["ttft_p50_s"] = statistics.median(ttfts)
        out["ttft_mean_s"] = statistics.fmean(ttfts)
    return out
