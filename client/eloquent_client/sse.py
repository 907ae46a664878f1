"""Reading an SSE stream with automatic resume: each event exactly once, across disconnects.

Works with any server that gives events ids; with ``EloquentMiddleware`` (ids ``<token>:<index>``, header
``x-eloquent-stream``) a reconnect picks up exactly after the last event received, without a second engine
request. Between attempts it waits ``backoff * 2**n`` seconds (n = failed attempts in a row, reset by progress).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from eloquent_plugins.core.protocol import STREAM_HEADER, BadEventId, ResumePoint, parse_event_id
from eloquent_plugins.core.sse_reader import SSEMessage, SSEParser

from eloquent_client.events import HTTPStatusError

SSEStreamError = HTTPStatusError
"""The name this error had before it joined the ``ClientError`` family (kept for callers that import it)."""


def _resume_point(event_id: str | None) -> ResumePoint | None:
    """Where an event id says the stream is, if it is an Eloquent id (``<token>:<index>``); None for any other
    id, which is then passed on but not used to skip repeats."""
    if not event_id:
        return None
    try:
        point = parse_event_id(event_id)
    except BadEventId:
        return None
    return point if point.after >= 0 else None


async def stream_sse(client: httpx.AsyncClient, method: str, url: str, *, json: Any = None,
                     headers: Mapping[str, str] | None = None, resume: bool = True, max_retries: int = 8,
                     backoff: float = 0.1) -> AsyncIterator[SSEMessage]:
    """Yield the stream's messages; stop after ``[DONE]`` or the end of the body.

    On a transport error (connection reset, truncated body, timeout) it reconnects with ``Last-Event-ID`` when
    ``resume`` is set and the server gave something to resume from; otherwise, or after ``max_retries`` failed
    attempts in a row, the error propagates. A message repeated by the server (same id index) is skipped.
    """
    last_id: str | None = None
    last_point: ResumePoint | None = None
    token: str | None = None
    failures = 0
    while True:
        request_headers = {"accept": "text/event-stream", "cache-control": "no-store", **(headers or {})}
        if last_id is not None:
            request_headers["last-event-id"] = last_id
        elif token is not None:
            request_headers["last-event-id"] = token  # nothing received yet: resume from the start
        resuming = "last-event-id" in request_headers and (last_id is not None or token is not None)
        try:
            async with client.stream(method, url, json=json, headers=request_headers) as response:
                if response.status_code == 204:
                    return
                if response.status_code != 200:
                    raw = await response.aread()
                    try:
                        body: Any = response.json()
                    except ValueError:
                        body = raw.decode("utf-8", "replace")
                    what = "resume" if resuming else "stream"
                    raise HTTPStatusError(response.status_code, body,
                                         f"{what} failed with HTTP {response.status_code}: {body}")
                token = response.headers.get(STREAM_HEADER, token)
                parser = SSEParser()
                async for chunk in response.aiter_bytes():
                    for message in parser.feed(chunk):
                        point = _resume_point(message.id)
                        if point is not None and last_point is not None and point.token == last_point.token \
                                and point.after <= last_point.after:
                            continue  # already delivered
                        if message.id is not None:
                            last_id = message.id
                            last_point = point
                        failures = 0
                        yield message
                        if message.data == "[DONE]":
                            return
                return
        except httpx.TransportError:
            if not resume or (last_id is None and token is None) or failures >= max_retries:
                raise
            failures += 1
            await asyncio.sleep(backoff * (2 ** (failures - 1)))
