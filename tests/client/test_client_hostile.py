"""The Python client against a hostile server (issue 28; the server is ``tests/support/hostile_server.py``, in its
own process, so what the client holds is measured alone with tracemalloc):

- an endless error body (SSE over TCP and HTTP/3): ``HTTPStatusError`` with the first 64 KiB, bounded memory;
- endless fallback records for events that can never be rendered: ``ServerLimitExceeded`` (a ``ClientError``),
  memory bounded by ``max_buffered_bytes``;
- an SSE line over the parser's 4 MiB limit: a ``ClientError`` (and ``httpx.ReadError`` through the transport);
- ``Alt-Svc`` to another port with a 400-digit ``ma``: the entry expires within a day, and no datagram reaches
  the other port (it was not allowed, and ``verify=False`` proves nothing about it).
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from eloquent_client import ClientError, EloquentClient, HTTPStatusError
from eloquent_client.bounds import MAX_ERROR_BODY, ServerLimitExceeded
from eloquent_client.httpx_transport import AsyncEloquentTransport
from eloquent_client.paths import MAX_ALT_SVC_AGE, PathMemory

from eloquent_plugins.core.errors import LimitExceeded
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.transports.http3.certs import dev_certificate
from tests.support.servers import free_port

BUDGET = Limits(max_buffered_bytes=1 << 20)
"""A smaller per-stream buffer than the default 8 MiB: the test reaches it sooner."""
CEILING = 24 << 20
"""Peak bytes the client may allocate while refusing 64 MiB (the hostile server's endless bodies stop there)."""


@dataclass
class Hostile:
    tcp: int
    udp: int
    other: int
    """A UDP port of another service: the test counts what reaches it."""

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.tcp}"


@pytest.fixture(scope="module")
def hostile() -> Iterator[Hostile]:
    pair = dev_certificate()
    tcp, udp, other = free_port(), free_port(), free_port()
    proc = subprocess.Popen([sys.executable, "-m", "tests.support.hostile_server", str(tcp), str(udp), str(other),
                             str(pair.certfile), str(pair.keyfile)], stdout=subprocess.PIPE)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        yield Hostile(tcp, udp, other)
    finally:
        proc.terminate()
        proc.wait(10)


async def peak(action: Callable[[], Awaitable[Any]]) -> tuple[int, Any]:
    """The peak traced allocation while ``action`` runs, and what it raised (or returned)."""
    tracemalloc.start()
    try:
        try:
            outcome: Any = await action()
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            outcome = exc
        return tracemalloc.get_traced_memory()[1], outcome
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("transport", ["sse", "eloquent"])
async def test_an_endless_error_body_is_cut_at_the_ceiling(hostile: Hostile, transport: str) -> None:
    async def call() -> None:
        async with EloquentClient(hostile.http, transport=transport, verify=False,  # type: ignore[arg-type]
                                  h3_port=hostile.udp, timeout=30, path_memory=PathMemory()) as client, \
                client.stream("POST", "/endless-error", json={"stream": True}):
            pass

    used, error = await peak(call)
    assert isinstance(error, HTTPStatusError) and error.status == 500, error
    assert len(error.content) == MAX_ERROR_BODY
    assert used < CEILING, f"{used / 2**20:.1f} MiB"  # was: 1.5 GB in 4.4 s (SSE), 149 MiB (HTTP/3)


async def test_endless_fallback_records_are_a_typed_error_within_the_buffer_limit(hostile: Hostile) -> None:
    async def call() -> None:
        async with EloquentClient(hostile.http, transport="eloquent", verify=False, h3_port=hostile.udp,
                                  timeout=30, path_memory=PathMemory(), limits=BUDGET) as client, \
                client.stream("POST", "/endless-fallback", json={"stream": True}) as stream:
            await stream.text()

    used, error = await peak(call)
    assert isinstance(error, ServerLimitExceeded) and isinstance(error, ClientError), repr(error)
    assert isinstance(error, LimitExceeded)  # still the core's error for callers that catch that
    assert "limit 1048576" in str(error)
    assert used < CEILING, f"{used / 2**20:.1f} MiB"  # was: 163 MiB in 60 s (the server sends up to 64 MiB)


async def test_an_oversized_sse_line_is_a_client_error_and_an_httpx_error(hostile: Hostile) -> None:
    async with EloquentClient(hostile.http, transport="sse", path_memory=PathMemory()) as client:
        with pytest.raises(ClientError) as caught:
            async with client.stream("POST", "/oversized-line", json={"stream": True}) as stream:
                await stream.text()
    assert isinstance(caught.value, ServerLimitExceeded)  # was: the core's LimitExceeded, no ClientError
    transport = AsyncEloquentTransport(transport="sse", path_memory=PathMemory())
    async with httpx.AsyncClient(transport=transport, base_url=hostile.http, timeout=30) as http:
        with pytest.raises(httpx.ReadError):
            async with http.stream("POST", "/oversized-line", json={"stream": True}) as response:
                await response.aread()


class Counter(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.datagrams = 0

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.datagrams += 1


async def test_alt_svc_to_another_port_is_not_followed_and_ma_is_capped(hostile: Hostile) -> None:
    loop = asyncio.get_running_loop()
    counter = Counter()
    transport, _ = await loop.create_datagram_endpoint(lambda: counter, local_addr=("127.0.0.1", hostile.other),
                                                       family=socket.AF_INET)
    try:
        memory = PathMemory()
        headers = {"authorization": "Bearer secret"}
        for options in ({}, {"alt_svc_ports": (hostile.other,)}):  # allowed, but verify=False proves nothing
            async with EloquentClient(hostile.http, verify=False, path_memory=memory, h3_probe_timeout=0.3,
                                      headers=headers, **options) as client:  # type: ignore[arg-type]
                for _ in range(3):
                    async with client.stream("POST", "/alt-svc", json={"stream": True}) as stream:
                        assert "[DONE]" in [e.data for e in [ev async for ev in stream.events()]]
                        assert stream.delivery == "sse"
                assert client.h3_port == hostile.tcp
        origin = f"http://127.0.0.1:{hostile.tcp}"
        assert memory.h3_port(origin) == hostile.other  # learnt, and ...
        assert memory.h3_port(origin, now=time.monotonic() + MAX_ALT_SVC_AGE + 1) is None  # ... a day at most
        await asyncio.sleep(0.5)  # let any stray datagram land
        assert counter.datagrams == 0  # was: requests 2 and 3 went there, Authorization included
    finally:
        transport.close()
