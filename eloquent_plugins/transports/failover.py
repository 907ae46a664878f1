"""Several upstreams behind one gateway (``--upstream openai=URL1,URL2``): a failover list, not a scheduler.

Streams go to the first upstream that is not marked down, in the order given. An upstream that refuses the
connection, or dies mid-stream (its body breaks, or ends before the answer finished), is marked down for
``down_for`` seconds (then tried again); a stream it was serving migrates in-process to the next upstream: the
answer so far is read back from the events already relayed and ``core.continuation`` builds the request for the
rest, whose events are spliced in. A request is sent again only when it never reached an upstream (the
connection was refused): a failure after it was sent but before any event (the upstream may have started it)
ends the stream with an error event, as with one upstream, never a second send of the same request.

For load balancing by queue depth or KV-cache locality, put a real router (vLLM's router, llm-d, an Envoy AI
gateway) behind the gateway instead (docs/OPENAI.md, "Several upstreams").
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from eloquent_plugins.core.continuation import (MAX_MIGRATIONS, MAX_RECORD_BYTES, CannotContinue, Splice, plan,
                                                read_emitted)
from eloquent_plugins.core.sse_reader import SSEParser
from eloquent_plugins.core.sse_writer import format_event
from eloquent_plugins.transports.dialect import Dialect, read_limited

if TYPE_CHECKING:
    from starlette.requests import Request

log = logging.getLogger("eloquent_plugins.transports.proxy")

DOWN_FOR = 10.0
"""Seconds an upstream that failed stays out of the rotation before it is tried again."""
PROBE_TIMEOUT = 2.0
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout)
"""Failures that prove the request never reached the upstream: the only ones after which it is sent elsewhere."""


def split_urls(spec: str) -> list[str]:
    """``URL1,URL2`` -> the URLs, in order, empty items dropped."""
    return [part.strip() for part in spec.split(",") if part.strip()]


@dataclass(slots=True)
class UpstreamSet:
    """The upstreams of one gateway and which are down (passive health: a failure marks one down)."""

    urls: tuple[str, ...]
    down_for: float = DOWN_FOR
    clock: Callable[[], float] = time.monotonic
    down_until: dict[str, float] = field(default_factory=dict)
    vllm: dict[str, bool] = field(default_factory=dict)
    """Upstreams found to be vLLM (``GET /version``): they continue a token-id prompt exactly."""
    failovers: int = 0
    """Streams moved to another upstream mid-answer, since start."""

    def order(self, exclude: set[str] | frozenset[str] = frozenset()) -> list[str]:
        """Healthy upstreams in the configured order, then the down ones, soonest back first."""
        now = self.clock()
        urls = [u for u in self.urls if u not in exclude]
        healthy = [u for u in urls if self.down_until.get(u, 0.0) <= now]
        down = sorted((u for u in urls if u not in healthy), key=lambda u: self.down_until[u])
        return healthy + down

    def mark_down(self, url: str, why: str) -> None:
        if self.down_until.get(url, 0.0) <= self.clock():
            log.warning("upstream %s marked down for %.0fs: %s", url, self.down_for, why)
        self.down_until[url] = self.clock() + self.down_for

    def mark_up(self, url: str) -> None:
        if self.down_until.pop(url, None) is not None:
            log.info("upstream %s is back", url)

    async def is_vllm(self, client: httpx.AsyncClient, url: str) -> bool:
        """Whether ``url`` is vLLM, asked once (``GET /version`` answers ``{"version": ...}`` on vLLM only)."""
        known = self.vllm.get(url)
        if known is None:
            try:
                response = await client.get(url + "/version", timeout=PROBE_TIMEOUT)
                known = response.status_code == 200 and "version" in response.json()
            except (httpx.HTTPError, ValueError):
                return False  # not cached: an upstream that is down now may be vLLM when it is back
            self.vllm[url] = known
        return known


class Relay(Protocol):
    """What the failover relay uses of the gateway's relay (``proxy.UpstreamRelay``): its pooled client, and how
    it builds a stream request for a given upstream; nothing else of it."""

    @property
    def label(self) -> str: ...

    @property
    def client(self) -> httpx.AsyncClient: ...

    @property
    def migrate(self) -> bool: ...

    def forward_headers(self, request: Request) -> list[tuple[str, str]]: ...

    def target_of(self, request: Request) -> str: ...

    def build(self, base: str, target: str, headers: list[tuple[str, str]], body: bytes, *,
              stream: bool) -> httpx.Request: ...


@dataclass(slots=True)
class _Relayed:
    """The payloads sent to the client so far, for a continuation (bounded: past it, no migration)."""

    payloads: list[bytes] = field(default_factory=list)
    size: int = 0
    over: bool = False

    def add(self, payload: bytes) -> None:
        if self.over:
            return
        self.size += len(payload)
        if self.size > MAX_RECORD_BYTES * 4:
            self.over, self.payloads = True, []
        else:
            self.payloads.append(payload)


async def failover_relay(relay: Relay, upstreams: UpstreamSet, request: Request, body: bytes,
                         dialect: Dialect) -> AsyncIterator[bytes]:
    """The stream relay over several upstreams (``UpstreamRelay.stream`` when it has more than one)."""
    codec = getattr(dialect, "codec", None)
    route = request.scope["path"]
    target: str | None = None  # None: the client's own request target
    original: Any = None
    relayed = _Relayed()
    splice: Splice | None = None
    tried: set[str] = set()
    migrations = 0
    space = True
    headers = relay.forward_headers(request)
    while True:
        candidates = upstreams.order(exclude=tried)
        if not candidates:
            for payload in dialect.error(f"{relay.label}: every upstream failed ({', '.join(upstreams.urls)})",
                                         "generation", 502):
                yield format_event(payload, space=space)
            return
        url = candidates[0]
        tried.add(url)
        upstream = relay.build(url, target if target is not None else relay.target_of(request), headers, body,
                               stream=True)
        try:
            response = await relay.client.send(upstream, stream=True)
        except _NOT_SENT as exc:
            upstreams.mark_down(url, f"cannot connect: {exc!r}")
            continue  # it never reached this upstream: the next one gets the same request
        except httpx.HTTPError as exc:
            upstreams.mark_down(url, f"failed before answering: {exc!r}")
            for payload in dialect.error(f"{relay.label} upstream {url} failed: {exc!r}", "generation", 502):
                yield format_event(payload, space=space)
            return
        why = ""
        try:
            if response.status_code != 200:
                for payload in dialect.rejected(response.status_code, await read_limited(response)):
                    yield format_event(payload, space=space)
                return
            upstreams.mark_up(url)
            parser = SSEParser()
            first = True
            try:
                async for chunk in response.aiter_bytes():
                    for message in parser.feed(chunk):
                        if first and splice is None:
                            space = not (message.raw.startswith(b"data:") and message.raw[5:6] != b" ")
                        first = False
                        payload = message.data.encode()
                        for out in splice.payloads(payload) if splice is not None else (payload,):
                            dialect.observe(out)
                            relayed.add(out)
                            yield format_event(out, event=message.event if message.event != "message" else None,
                                               space=space)
            except httpx.HTTPError as exc:
                why = f"stream broke: {exc!r}"
            if not why:
                ending = dialect.unfinished()
                if not ending:
                    return
                why = "stream ended before the answer finished"
        finally:
            await response.aclose()
        upstreams.mark_down(url, why)
        try:
            if not relay.migrate:
                raise CannotContinue("migration is off")
            if codec is None or relayed.over:
                raise CannotContinue("no record of this stream's events" if relayed.over else "no rules")
            if migrations >= MAX_MIGRATIONS:
                raise CannotContinue(f"migrated {MAX_MIGRATIONS} times already")
            if original is None:
                original = json.loads(body)
            nxt = upstreams.order(exclude=tried)
            if not nxt:
                raise CannotContinue("no other upstream")
            emitted = read_emitted(codec, relayed.payloads)
            cont = plan(route, codec, original, emitted,
                        token_ids=await upstreams.is_vllm(relay.client, nxt[0]))
        except (CannotContinue, ValueError) as exc:
            log.warning("stream on %s: %s; not migrated (%s)", url, why, exc)
            for payload in dialect.error(f"{relay.label} upstream {why}", "incomplete_generation", 502):
                yield format_event(payload, space=space)
            return
        migrations += 1
        upstreams.failovers += 1
        log.info("stream on %s: %s; migrating to %s after %d tokens (continuing with %s %s)", url, why, nxt[0],
                 emitted.tokens, cont.source, cont.route)
        target, body, splice = cont.route, cont.encoded(), Splice(cont, emitted)
