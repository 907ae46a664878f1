"""``transport="auto"`` races, it does not probe (issue 26): the QUIC handshake and SSE over TCP start together
(QUIC gets ``h3_probe_timeout`` of head start), a stream begins on whichever answers first and moves to Eloquent
datagrams when QUIC is up; a handshake that lost packets is not a blocked path; TCP refused fails at once; a
blocked UDP path costs the first token nothing; a blocked path is retried after seconds, backing off.

Against ``eloquent serve`` through ``eloquent relay``-style loss (10 %, mean burst 2) on the UDP path."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from eloquent_client import ConnectError, EloquentClient, Http3ClientConnection, PathMemory
from eloquent_client.paths import DEFAULT_UDP_RETRY_AFTER, UDP_RETRY_FIRST

from eloquent_plugins.sim.netem import Outage, PathConfig
from eloquent_plugins.sim.udp_relay import Relay, RelayConfig, start_relay
from tests.support.client_servers import CHAT, Served, chat_body, eloquent_serve
from tests.support.servers import free_port

LOSSY = PathConfig(loss=0.10, burst=2.0, delay=0.005)
CONNECTS = 50
AT_ONCE = 10
TOKENS = 100
"""At the server's 30 ms per token a stream lasts 3 s: time for a handshake that lost packets to come up."""


class RecordingMemory(PathMemory):
    """A ``PathMemory`` that keeps every path it was told is blocked."""

    def __init__(self) -> None:
        super().__init__()
        self.marked: list[tuple[str, int]] = []

    def mark_broken(self, host: str, port: int, retry_after: float = DEFAULT_UDP_RETRY_AFTER,
                    now: float | None = None) -> float:
        self.marked.append((host, port))
        return super().mark_broken(host, port, retry_after, now)


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    with eloquent_serve("--tpot", "0.03", "--ttft", "0.02") as s:
        yield s


@pytest.fixture
async def lossy_relay(served: Served) -> AsyncIterator[Relay]:
    r = await start_relay(RelayConfig(target=("127.0.0.1", served.udp_port), upstream=LOSSY, downstream=LOSSY,
                                      seed=26))
    yield r
    await r.close()


async def one_fresh_stream(served: Served, udp_port: int, memory: PathMemory,
                           prompt: str) -> tuple[str, list[str]]:
    async with EloquentClient(served.http, verify=False, h3_port=udp_port, path_memory=memory) as client:
        async with client.stream("POST", CHAT, json=chat_body(prompt, TOKENS)) as s:
            text = await s.text()
            return text, s.deliveries


async def test_fresh_connects_through_loss_all_end_on_datagrams(served: Served, lossy_relay: Relay) -> None:
    memory = RecordingMemory()
    prompts = [f"Tell me about race {i % 5}." for i in range(CONNECTS)]
    expected = {p: served.text(p, TOKENS) for p in set(prompts)}
    gate = asyncio.Semaphore(AT_ONCE)

    async def run(prompt: str) -> tuple[str, str, list[str]]:
        async with gate:
            text, deliveries = await one_fresh_stream(served, lossy_relay.listen_addr[1], memory, prompt)
            return prompt, text, deliveries

    results = await asyncio.wait_for(asyncio.gather(*(run(p) for p in prompts)), 600)
    began_on_tcp = sum(1 for _, _, d in results if d[0] == "sse")
    print(f"{CONNECTS} fresh connects: {CONNECTS - began_on_tcp} began on datagrams, {began_on_tcp} began on SSE "
          f"and moved over; relay dropped {lossy_relay.stats.upstream.dropped} up, "
          f"{lossy_relay.stats.downstream.dropped} down")
    for prompt, text, deliveries in results:
        assert text == expected[prompt]
        assert deliveries[-1] == "datagram", deliveries  # every stream ends on datagrams
        # "h3-stream" on the way: the request reached the server before the client's SETTINGS (lost packets), so
        # it was served on the request stream; it moved to datagrams like one that began on TCP.
        assert set(deliveries) <= {"sse", "h3-stream", "datagram"}, deliveries
    assert memory.marked == [], memory.marked  # a handshake that lost packets is not a blocked path
    assert lossy_relay.stats.upstream.dropped + lossy_relay.stats.downstream.dropped > 0


async def test_blocked_udp_costs_the_first_token_nothing(served: Served) -> None:
    """UDP dropped entirely: the first token comes over TCP while the handshake is still unanswered; the bound is
    against the same request over plain SSE in this run (a busy machine slows both)."""
    blocked = await start_relay(RelayConfig(target=("127.0.0.1", served.udp_port), outages=(Outage(0.0, 1e6),)))
    try:
        async def first_token(transport: str) -> tuple[float, EloquentClient, list[str]]:
            client = EloquentClient(served.http, verify=False, h3_port=blocked.listen_addr[1],
                                    path_memory=PathMemory(), transport=transport)  # type: ignore[arg-type]
            started = time.monotonic()
            async with client.stream("POST", CHAT, json=chat_body("Tell me about walls.", 20)) as s:
                async for _ in s.text_deltas():
                    break
                elapsed = time.monotonic() - started
                pending = client._paths.task is not None and not client._paths.task.done()
                deliveries = s.deliveries
            await client.aclose()
            assert transport == "sse" or pending, "the first token waited for the handshake to give up"
            return elapsed, client, deliveries

        plain, _, _ = await first_token("sse")
        raced, client, deliveries = await first_token("auto")
    finally:
        await blocked.close()
    print(f"first token with UDP blocked: {raced * 1000:.0f} ms (plain SSE: {plain * 1000:.0f} ms)")
    assert deliveries == ["sse"]
    assert raced - plain < 1.0


async def test_tcp_refused_fails_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing listens: ``ConnectError`` from TCP's refusal in under 2 s with the default 30 s timeout, and the
    handshake was given up (cancelled), not waited on."""
    ended: list[str] = []
    original = Http3ClientConnection.connect.__func__  # type: ignore[attr-defined]

    async def watched(cls, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return await original(cls, *args, **kwargs)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise
        except BaseException as exc:
            ended.append(type(exc).__name__)
            raise

    monkeypatch.setattr(Http3ClientConnection, "connect", classmethod(watched))
    dead = f"http://127.0.0.1:{free_port()}"
    async with EloquentClient(dead, verify=False, path_memory=PathMemory()) as client:
        assert client.transport == "auto" and client.timeout == 30.0
        for streaming in (True, False):
            started = time.monotonic()
            with pytest.raises(ConnectError) as caught:
                if streaming:
                    async with client.stream("POST", CHAT, json=chat_body("x")):
                        pass
                else:
                    await client.request("GET", "/v1/models")
            elapsed = time.monotonic() - started
            assert "HTTP/3" not in str(caught.value), caught.value  # TCP's refusal, not a UDP timeout
            assert elapsed < 2.0, f"{elapsed:.2f} s"
    assert ended and all(e == "cancelled" for e in ended), ended


def test_blocked_path_is_retried_after_seconds_backing_off() -> None:
    memory = PathMemory()
    waits = [memory.mark_broken("h", 1, now=0.0) for _ in range(8)]
    assert waits == [UDP_RETRY_FIRST * 2 ** i for i in range(5)] + [DEFAULT_UDP_RETRY_AFTER] * 3
    assert waits[0] <= 5 and DEFAULT_UDP_RETRY_AFTER <= 60
    assert memory.is_broken("h", 1, now=DEFAULT_UDP_RETRY_AFTER - 1)
    assert not memory.is_broken("h", 1, now=DEFAULT_UDP_RETRY_AFTER + 1)
    memory.mark_working("h", 1)
    assert memory.mark_broken("h", 1, now=100.0) == UDP_RETRY_FIRST  # it worked since: the backoff starts over


@pytest.mark.parametrize("value", ['h3=":²"', 'h3=":٨٠٨٠"', 'h3=":8443"; ma=²', 'h3=":８４４３"', 'h3=":0"',
                                   'h3=":99999"', 'h3="host"', 'h2=":8443"'])
def test_alt_svc_parser_takes_ascii_digits_only(value: str) -> None:
    """Non-ASCII digits (which ``str.isdigit`` and ``\\d`` accept) are a malformed value, not a ``ValueError``."""
    from eloquent_client.paths import parse_alt_svc

    service = parse_alt_svc(value)
    if "ma=" in value:  # the port is fine, the max-age is not: ignored (the default age), never an error
        assert service is not None and service.port == 8443 and service.max_age == 86400.0
    else:
        assert service is None
    memory = PathMemory()
    memory.learn("http://h:80", value)  # what the client does with every response's header: no exception
    assert memory.h3_port("http://h:80") == (8443 if "ma=" in value else None)


def test_the_client_has_a_version() -> None:
    import importlib.metadata

    import eloquent_client

    import eloquent_plugins

    assert eloquent_client.__version__ == importlib.metadata.version("eloquent-plugins")
    assert eloquent_client.__version__ == eloquent_plugins.__version__
    assert "__version__" in eloquent_client.__all__
