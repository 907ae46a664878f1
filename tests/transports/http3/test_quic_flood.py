"""Fake QUIC Initials (issue 18 item 1) and a failed client connect (issue 14): the front end's listener
(``h3glue.GuardedQuicServer``) keeps no state for Initials that do not decrypt, caps and times out handshakes,
answers with a stateless Retry under load, and removes a connection in O(its own cids); the client leaves no
aioquic timer behind when a connect fails.

The flood test runs ``eloquent serve`` as a subprocess (its RSS is read from /proc) and sends 1000 fake
1200-byte Initials/s for 10 s from one UDP socket while an SSE stream (TCP) and an Eloquent datagram stream run.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eloquent_client import EloquentClient, Http3ClientConnection
from eloquent_client.events import ClientError

from eloquent_plugins.transports.config import StreamConfig
from eloquent_plugins.engine import EngineConfig, create_engine_app
from eloquent_plugins.h3glue.listener import aioquic_drift
from eloquent_plugins.transports.http3.options import FrontEndOptions
from eloquent_plugins.transports.http3.server import start_http3_server
from tests.support.quic_wire import SERVER, handshake, listener, quic_client, send_initial
from tests.support.servers import eloquent_serve_process, free_port

CHAT = {"model": "eloquent-builtin", "messages": [{"role": "user", "content": "flood"}], "stream": True}


def fake_initial() -> bytes:
    """A QUIC v1 Initial header with random 8-byte cids, no token, and a random (undecryptable) payload: 1200 B."""
    head = b"\xc3" + (1).to_bytes(4, "big") + b"\x08" + os.urandom(8) + b"\x08" + os.urandom(8) + b"\x00"
    rest = 1200 - len(head) - 2
    return head + (0x4000 | rest).to_bytes(2, "big") + os.urandom(rest)


def is_retry(datagram: bytes) -> bool:
    return datagram[0] & 0xF0 == 0xF0  # long header, QUIC v1 packet type 3


class CountingDict(dict):  # type: ignore[type-arg]
    """A dict that counts every walk over it (what upstream's removal does, once per closed connection)."""

    walks = 0
    deletes = 0

    def __iter__(self) -> Any:
        type(self).walks += 1
        return super().__iter__()

    def items(self) -> Any:
        type(self).walks += 1
        return super().items()

    def values(self) -> Any:
        type(self).walks += 1
        return super().values()

    def __delitem__(self, key: Any) -> None:
        type(self).deletes += 1
        super().__delitem__(key)

    def keys(self) -> Any:
        type(self).walks += 1
        return super().keys()


def address(i: int) -> tuple[str, int]:
    return (f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}", 40000 + i % 20000)


# ---- the listener, in memory -----------------------------------------------------------------------------------
def test_aioquic_internals_unchanged() -> None:
    assert aioquic_drift() == [], ("aioquic changed what h3glue.GuardedQuicServer copies or relies on: review "
                                   "it against the new aioquic, then update h3glue._UPSTREAM")


async def test_undecryptable_initials_make_no_state_and_get_no_answer() -> None:
    server, wire = listener()
    for i in range(2000):
        server.datagram_received(fake_initial(), address(i))
    assert server.stats.undecryptable == 2000 and server.stats.admitted == 0
    assert not server._protocols and not wire.sent and server.handshaking == 0
    server.close()


async def test_removal_touches_only_the_connections_own_cids() -> None:
    server, wire = listener(retry="off", max_handshakes=10_000, max_handshakes_per_address=10_000,
                            handshake_timeout=0.5)
    n = 150
    for i in range(n):
        send_initial(server, quic_client(), address(i))
    assert server.stats.admitted == n and server.handshaking == n and len(server._protocols) == 2 * n
    server._protocols = CountingDict(server._protocols)
    CountingDict.walks = 0
    await asyncio.sleep(0.8)  # every handshake times out: n removals
    assert server.stats.expired == n and server.handshaking == 0 and not server._protocols
    assert CountingDict.walks == 0, "removing a connection walked the whole connection-id map"

    # The same at scale, without the handshakes: 5,000 removals from a map of 10,000 cids.
    class Proto:
        pass

    server._protocols = CountingDict(server._protocols)
    CountingDict.walks = CountingDict.deletes = 0
    protocols = [Proto() for _ in range(5000)]
    for i, proto in enumerate(protocols):
        server._cids[proto] = set()  # type: ignore[index]
        server._connection_id_issued(b"a%07d" % i, proto)  # type: ignore[arg-type]
        server._connection_id_issued(b"b%07d" % i, proto)  # type: ignore[arg-type]
    started = time.perf_counter()
    for proto in protocols:
        server._connection_terminated(proto)  # type: ignore[arg-type]
    elapsed = time.perf_counter() - started
    assert not server._protocols and CountingDict.walks == 0
    assert CountingDict.deletes == 2 * len(protocols)  # each removal touched exactly its own two cids
    print(f"5,000 removals: {elapsed * 1e3:.1f} ms")
    server.close()


async def test_a_handshake_that_times_out_is_dropped_without_a_packet() -> None:
    server, wire = listener(handshake_timeout=60.0)
    client = quic_client()
    send_initial(server, client, address(1))
    assert server.handshaking == 1 and wire.take(address(1))  # the server's first flight
    (protocol,) = set(server._protocols.values())
    server._expire(protocol)  # what the handshake timer does
    assert wire.sent == [] and server.handshaking == 0 and not server._protocols
    assert server.stats.expired == 1 and protocol._timer is None
    await asyncio.wait_for(protocol.wait_closed(), 1)
    server.close()


async def test_caps_shed_new_handshakes_with_a_retry_and_a_retried_client_completes_after_the_load() -> None:
    server, wire = listener(retry="auto", retry_threshold=8, max_handshakes_per_address=4, handshake_timeout=60.0)
    for i in range(6):  # one address: 4 admitted, then Retry
        send_initial(server, quic_client(), ("192.0.2.1", 5000 + i))
    assert server.handshaking == 4 and server.stats.retried == 2
    for i in range(10):  # many addresses: Retry from the 8th handshake on
        send_initial(server, quic_client(), address(i))
    assert server.handshaking == 8 and server.stats.retried == 2 + 6
    assert all(is_retry(data) for data, to in wire.sent if to == address(9))

    # A client told to retry while loaded comes back with its token after the load is gone: still admitted.
    late = quic_client()
    send_initial(server, late, address(100))
    (retry,) = wire.take(address(100))
    assert is_retry(retry)
    for protocol in set(server._protocols.values()):
        server._expire(protocol)
    assert server.handshaking == 0
    late.receive_datagram(retry, SERVER, now=time.monotonic())
    assert handshake(server, wire, late, address(100))
    assert server.stats.invalid_tokens == 0 and server.handshaking == 0 and server.connection_count == 1

    # Off: no Retry, past the per-address cap the Initial is dropped.
    quiet, quiet_wire = listener(retry="off", max_handshakes_per_address=2, handshake_timeout=60.0)
    for i in range(5):
        send_initial(quiet, quic_client(), ("192.0.2.9", 6000 + i))
    assert quiet.handshaking == 2 and quiet.stats.shed == 3 and quiet.stats.retried == 0
    assert not any(is_retry(data) for data, _ in quiet_wire.sent)
    server.close()
    quiet.close()


async def test_retry_always_real_client_completes_and_handshake_count_returns_to_zero() -> None:
    app = create_engine_app(EngineConfig(ttft=0.01, tpot=0.002))
    srv = await start_http3_server(app, host="127.0.0.1", port=0, config=StreamConfig(),
                                   options=FrontEndOptions(retry="always"))
    try:
        async with EloquentClient(f"https://127.0.0.1:{srv.port}", verify=False, timeout=10) as client:
            async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 5}) as stream:
                assert await stream.text()
        assert srv.admission.retried >= 1 and srv.admission.admitted == 1 and srv.handshaking == 0
    finally:
        await srv.close()


def test_options_refuse_bad_values() -> None:
    from eloquent_plugins.core.errors import ConfigError

    with pytest.raises(ConfigError):
        FrontEndOptions(retry="sometimes").check()
    with pytest.raises(ConfigError):
        FrontEndOptions(handshake_timeout=0).check()
    with pytest.raises(ConfigError):
        FrontEndOptions.from_env({"ELOQUENT_QUIC_HANDSHAKE_TIMEOUT": "soon"})
    options = FrontEndOptions.from_env({"ELOQUENT_QUIC_RETRY": "off", "ELOQUENT_QUIC_HANDSHAKE_TIMEOUT": "2.5"})
    assert options.retry == "off" and options.handshake_timeout == 2.5


# ---- the client: a failed connect leaves nothing running -----------------------------------------------------
async def test_failed_connect_leaves_no_timer_or_unretrieved_exception() -> None:
    loop = asyncio.get_running_loop()
    loop.set_debug(True)
    seen: list[str] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: seen.append(str(context.get("message"))))
    try:
        for _ in range(2):
            with pytest.raises(ClientError):
                await Http3ClientConnection.connect("127.0.0.1", free_port(), verify=False, timeout=0.3)
        await asyncio.sleep(2.5)  # aioquic's first probe timers would have fired by now
        gc.collect()
        await asyncio.sleep(0.05)
    finally:
        loop.set_exception_handler(previous)
        loop.set_debug(False)
    assert seen == [], seen


# ---- the flood, against `eloquent serve` -----------------------------------------------------------------------
HANDSHAKE_TIMEOUT = 3.0
FLOOD_SECONDS = 10.0
FLOOD_RATE = 1000


@contextlib.contextmanager
def serve_subprocess(port: int) -> Iterator[subprocess.Popen[bytes]]:
    """``eloquent serve`` with a short handshake timeout and idle timeout (8 s: the fake connections plain aioquic
    keeps then expire inside the test window), so the test runs in well under a minute."""
    env = {"ELOQUENT_QUIC_HANDSHAKE_TIMEOUT": str(HANDSHAKE_TIMEOUT), "ELOQUENT_QUIC_IDLE_TIMEOUT": "8"}
    with eloquent_serve_process("--tpot", "0.02", "--ttft", "0.05", "--log-level", "warning", port=port,
                                env=env) as proc:
        yield proc


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def flood(port: int, stop: threading.Event, sent: list[int]) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    started = time.monotonic()
    count = 0
    while not stop.is_set() and (elapsed := time.monotonic() - started) < FLOOD_SECONDS:
        while count < int(elapsed * FLOOD_RATE):
            with contextlib.suppress(OSError):
                sock.sendto(fake_initial(), ("127.0.0.1", port))
            count += 1
        time.sleep(0.002)
    sock.close()
    sent.append(count)


async def paced_stream(client: EloquentClient, times: list[float]) -> None:
    async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 2000}) as stream:
        async for _ in stream.events():
            times.append(time.monotonic())


async def one_request(port: int) -> float:
    """Seconds a new client takes to connect and complete a short request (inf: it could not, within 10 s)."""
    started = time.monotonic()
    try:
        async with EloquentClient(f"https://127.0.0.1:{port}", verify=False, timeout=10) as client:
            async with client.stream("POST", "/v1/chat/completions", json={**CHAT, "max_tokens": 5}) as stream:
                assert await stream.text()
                assert stream.delivery == "eloquent"
    except (ClientError, TimeoutError) as exc:
        print(f"new client failed: {exc!r}")
        return float("inf")
    return time.monotonic() - started


def max_gap(times: list[float], until: float) -> float:
    marks = [*times, until]
    return max(b - a for a, b in zip(marks, marks[1:]))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS from /proc")
async def test_fake_initial_flood_does_not_stall_streams_or_grow_memory() -> None:
    port = free_port()
    with serve_subprocess(port) as proc:
        sse_times: list[float] = []
        dgram_times: list[float] = []
        async with EloquentClient(f"http://127.0.0.1:{port}", transport="sse", timeout=60) as sse, \
                EloquentClient(f"https://127.0.0.1:{port}", transport="eloquent", verify=False, timeout=60) as h3:
            tasks = [asyncio.create_task(paced_stream(sse, sse_times)),
                     asyncio.create_task(paced_stream(h3, dgram_times))]
            stop, sent = threading.Event(), []
            flooder = threading.Thread(target=flood, args=(port, stop, sent), daemon=True)
            try:
                while len(sse_times) < 10 or len(dgram_times) < 10:
                    await asyncio.sleep(0.05)
                    assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
                baseline = peak = rss_mb(proc.pid)
                started = time.monotonic()
                flooder.start()
                await asyncio.sleep(FLOOD_SECONDS / 2)
                during = await one_request(port)
                # Past the flood by the handshake timeout and a few seconds: the fake connections would all
                # have expired by then.
                end = started + FLOOD_SECONDS + HANDSHAKE_TIMEOUT + 3
                after_at = started + FLOOD_SECONDS + HANDSHAKE_TIMEOUT + 1
                while time.monotonic() < end:
                    peak = max(peak, rss_mb(proc.pid))
                    await asyncio.sleep(0.25)
                    if after_at and time.monotonic() >= after_at:
                        after, after_at = await one_request(port), 0.0
                stopped = time.monotonic()
            finally:
                stop.set()
                for task in tasks:
                    task.cancel()
                failures = [r for r in await asyncio.gather(*tasks, return_exceptions=True)
                            if not isinstance(r, asyncio.CancelledError | type(None))]
                if flooder.is_alive():
                    flooder.join(5)
        gaps = {"sse": max_gap(sse_times, stopped), "eloquent": max_gap(dgram_times, stopped)}
        print(f"flood: {sent[0]} fake Initials in {FLOOD_SECONDS:.0f} s; max gap sse {gaps['sse']:.3f} s, "
              f"eloquent {gaps['eloquent']:.3f} s; RSS {baseline:.0f} -> peak {peak:.0f} MB "
              f"(+{peak - baseline:.0f}); new client during {during:.2f} s, after {after:.2f} s")
        assert sent[0] >= 0.9 * FLOOD_RATE * FLOOD_SECONDS
        assert not failures, failures
        assert gaps["sse"] < 2.0 and gaps["eloquent"] < 2.0, gaps
        assert peak - baseline < 100, f"RSS grew {peak - baseline:.0f} MB"
        assert during < 5 and after < 5
