"""One request and one run of ``eloquent bench overhead``: the modes, the light client's request and its checks,
a level's requests in one mode. The leaf that :mod:`.overhead_live` (targets side by side), :mod:`.overhead_h3`
and :mod:`.overhead_vllm` share, so none of them imports another for these."""

from __future__ import annotations

import asyncio
import json
import re
import statistics
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from eloquent_plugins.cli.bench import lighthttp
from eloquent_plugins.core.protocol import DATAGRAM, STREAM_HEADER, TRANSPORT_HEADER

TAIL_BYTES = 4096
"""Bytes kept from the end of a stream: the usage chunk and ``data: [DONE]`` are in there."""
CONTENT_RE = re.compile(rb'"(?:content|text)":\s*"(?:[^"\\]|\\.)')
"""A non-empty ``content`` (chat) or ``text`` (completions) string: the first token, not the role chunk."""
ID_LINE_RE = re.compile(rb"\nid:")
DONE_RE = re.compile(rb"data: ?\[DONE\]\s*\Z")
USAGE_KEY = b'"completion_tokens":'
_INT_RE = re.compile(rb"\s*(\d+)")
MIDDLEWARE_HEADERS = ("x-accel-buffering", STREAM_HEADER)
BYPASS_HEADER = {TRANSPORT_HEADER.decode(): DATAGRAM.decode()}


@dataclass(frozen=True)
class Mode:
    name: str
    stream: bool
    headers: dict[str, str] = field(default_factory=dict)
    title: str = ""


NON_STREAMED = Mode("non-streamed", False, title="non-streamed")
STREAMED = Mode("streamed", True, title="streamed")
BYPASS = Mode("bypass", True, BYPASS_HEADER, title="streamed around the middleware")


# -- one request -----------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Outcome:
    tokens: int = 0
    """Completion tokens of a valid response (0 for an error)."""
    ttft: float | None = None
    middleware: bool = False
    """The response carried the middleware's headers."""
    id_lines: bool = False
    """An SSE ``id:`` line was seen up to the first token."""
    events: int = 0
    """SSE events received (``data:`` lines, counted per body piece): vLLM merges deltas when it falls behind."""
    error: str | None = None


def completion_tokens_from_tail(tail: bytes) -> int | None:
    """The last ``"completion_tokens": N`` in ``tail`` (the stream's usage chunk), or None."""
    at = tail.rfind(USAGE_KEY)
    if at < 0:
        return None
    match = _INT_RE.match(tail, at + len(USAGE_KEY))
    return int(match.group(1)) if match else None


async def one_request(conn: lighthttp.Connection, path: str, body: bytes, headers: dict[str, str], *,
                      stream: bool, max_tokens: int) -> Outcome:
    """POST one completion on ``conn`` and check it; never raises for the server's or the network's faults."""
    out = Outcome()

    def count_events(_result: lighthttp.Result, piece: bytes) -> None:
        out.events += piece.count(b"data:")

    try:
        if stream:
            response = await conn.request("POST", path, body, headers, tail=TAIL_BYTES, first=CONTENT_RE,
                                          on_piece=count_events)
        else:
            response = await conn.request("POST", path, body, headers)
    except (TimeoutError, lighthttp.ResponseError, OSError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"[:200]
        return out
    content = response.body
    out.middleware = any(name in response.headers for name in MIDDLEWARE_HEADERS)
    out.id_lines = ID_LINE_RE.search(b"\n" + response.prefix) is not None
    out.ttft = response.first_s
    if response.status != 200:
        out.error = f"HTTP {response.status}: {content[-200:].decode(errors='replace').strip()}"
        return out
    if stream:
        if not DONE_RE.search(content):
            out.error = "stream did not end with data: [DONE]"
            return out
        tokens = completion_tokens_from_tail(content)
    else:
        try:
            tokens = int(json.loads(content)["usage"]["completion_tokens"])
        except (ValueError, KeyError, TypeError):
            tokens = None
    if tokens is None:
        out.error = "no usage.completion_tokens in the response"
    elif tokens != max_tokens:
        out.error = f"completion_tokens {tokens} != max_tokens {max_tokens}"
    else:
        out.tokens = tokens
    return out


def request_body(model: str, max_tokens: int, stream: bool, i: int) -> bytes:
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream, "temperature": 0,
                            "ignore_eos": True, "messages": [{"role": "user", "content": f"Tell a story number {i}."}]}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return json.dumps(body).encode()


# -- one run: a level's requests in one mode -------------------------------------------------------------------


async def run_level(url: str, model: str, mode: Mode, max_tokens: int, concurrency: int, requests: int, *,
                    timeout: float = 600.0) -> dict[str, Any]:
    """``requests`` chat completions, ``concurrency`` at a time (one worker per connection), in ``mode``;
    completion tokens of the valid responses per wall-clock second."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    path = (parts.path.rstrip("/") or "") + "/v1/chat/completions"
    headers = {"content-type": "application/json", **mode.headers}
    bodies = [request_body(model, max_tokens, mode.stream, i) for i in range(requests)]
    outcomes: list[Outcome] = []
    todo = iter(bodies)

    async def worker() -> None:
        conn = lighthttp.Connection(host, port, timeout=timeout)
        try:
            for body in todo:
                outcomes.append(await one_request(conn, path, body, headers, stream=mode.stream,
                                                  max_tokens=max_tokens))
        finally:
            conn.close()

    cpu0 = time.process_time()
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    tokens = sum(o.tokens for o in outcomes)
    errors = [o.error for o in outcomes if o.error]
    ttfts = [o.ttft for o in outcomes if o.ttft is not None and not o.error]
    out: dict[str, Any] = {
        "mode": mode.name, "stream": mode.stream, "concurrency": concurrency, "requests": requests,
        "tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall if wall else 0.0, "errors": len(errors),
        "client_cpu_s": cpu, "events": sum(o.events for o in outcomes if not o.error),
        "via_middleware": sum(o.middleware for o in outcomes),
        "id_lines": sum(o.id_lines for o in outcomes)}
    if errors:
        out["error_sample"] = errors[0]
    if ttfts:
        out["ttft_p50_s"] = statistics.median(ttfts)
        out["ttft_mean_s"] = statistics.fmean(ttfts)
    return out


class PathError(RuntimeError):
    """A mode did not take the path it measures (the bypass went through the middleware, or the reverse)."""


def check_path(run: dict[str, Any], through_middleware: bool) -> None:
    done = run["requests"] - run["errors"]
    if through_middleware and run["via_middleware"] < done:
        raise PathError(f"{run['mode']}: {done - run['via_middleware']} of {done} responses lacked the "
                        f"middleware's headers ({', '.join(MIDDLEWARE_HEADERS)})")
    if not through_middleware and (run["via_middleware"] or run["id_lines"]):
        raise PathError(f"{run['mode']}: {run['via_middleware']} responses carried the middleware's headers and "
                        f"{run['id_lines']} had SSE id: lines; expected none (eloquent-transport: datagram)")
