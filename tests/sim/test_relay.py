"""``eloquent relay`` in-process with plain UDP sockets on 127.0.0.1: delay, loss, outages, a severed path, both
directions, several clients, FIFO by default, and the CLI's input checks."""

from __future__ import annotations

import asyncio

import pytest

from eloquent_plugins.cli.main import main
from eloquent_plugins.sim.netem import Outage, PathConfig
from eloquent_plugins.sim.udp_relay import RelayConfig, parse_hostport, start_relay
from eloquent_plugins.core.errors import ConfigError


class _Collector(asyncio.DatagramProtocol):
    """Records what arrives (with the loop time) and can echo it back to the sender."""

    def __init__(self, echo: bool = False) -> None:
        self.echo = echo
        self.received: list[tuple[bytes, tuple[str, int], float]] = []
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:  # type: ignore[no-untyped-def]
        self.received.append((data, addr, asyncio.get_running_loop().time()))
        if self.echo and self.transport is not None:
            self.transport.sendto(data, addr)


async def _endpoint(echo: bool = False, remote=None):  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    kwargs = {"remote_addr": remote} if remote else {"local_addr": ("127.0.0.1", 0)}
    transport, protocol = await loop.create_datagram_endpoint(lambda: _Collector(echo), **kwargs)
    return transport, protocol


async def _settle(condition, timeout: float = 20.0) -> None:  # type: ignore[no-untyped-def]
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition() and loop.time() < end:
        await asyncio.sleep(0.01)


async def _quiet(relay, period: float = 0.2) -> None:  # type: ignore[no-untyped-def]
    """Wait until the relay has nothing in flight for ``period``."""
    last = -1
    while True:
        s = relay.stats
        now = (s.upstream.forwarded, s.downstream.forwarded, s.upstream.received, s.downstream.received)
        if now == last:
            return
        last = now
        await asyncio.sleep(period)


async def test_delay_is_applied_in_both_directions() -> None:
    server_t, server = await _endpoint(echo=True)
    relay = await start_relay(RelayConfig(target=server_t.get_extra_info("sockname"),
                                          upstream=PathConfig(delay=0.04), downstream=PathConfig(delay=0.06)))
    client_t, client = await _endpoint(remote=relay.listen_addr)
    loop = asyncio.get_running_loop()
    sent = {}
    for i in range(5):
        sent[i] = loop.time()
        client_t.sendto(b"ping %d" % i)
        await asyncio.sleep(0.01)
    await _settle(lambda: len(client.received) == 5)
    assert [d for d, _, _ in client.received] == [b"ping %d" % i for i in range(5)]
    for (data, _, arrived), (i, t0) in zip(client.received, sent.items()):
        assert arrived - t0 >= 0.1 - 0.002  # 40 ms up + 60 ms down, never less
    for (data, _, arrived), (i, t0) in zip(server.received, sent.items()):
        assert arrived - t0 >= 0.04 - 0.002
    await relay.close()
    client_t.close()
    server_t.close()


async def test_loss_rate_is_roughly_right_and_seeded() -> None:
    counts = []
    for _ in range(2):
        server_t, server = await _endpoint()
        relay = await start_relay(RelayConfig(target=server_t.get_extra_info("sockname"),
                                              upstream=PathConfig(loss=0.3, burst=2.0), seed=42))
        client_t, _ = await _endpoint(remote=relay.listen_addr)
        for i in range(2000):
            client_t.sendto(b"%d" % i)
            if i % 25 == 0:
                await asyncio.sleep(0.002)  # pace it so no socket buffer overflows on a busy machine
        await _settle(lambda: relay.stats.upstream.received == 2000)
        await _quiet(relay)
        assert relay.stats.upstream.dropped + relay.stats.upstream.forwarded == 2000
        counts.append(relay.stats.upstream.forwarded)
        await _settle(lambda: len(server.received) == counts[-1])
        await relay.close()
        client_t.close()
        server_t.close()
    assert 0.25 < 1 - counts[0] / 2000 < 0.35
    assert counts[0] == counts[1]  # same seed, same packets: same fates


async def test_downstream_loss_only_hits_the_server_to_client_direction() -> None:
    server_t, server = await _endpoint(echo=True)
    relay = await start_relay(RelayConfig(target=server_t.get_extra_info("sockname"),
                                          downstream=PathConfig(loss=0.4), seed=1))
    client_t, client = await _endpoint(remote=relay.listen_addr)
    for i in range(1000):
        client_t.sendto(b"%d" % i)
        if i % 25 == 0:
            await asyncio.sleep(0.002)
    await _settle(lambda: relay.stats.downstream.received == 1000)
    await _quiet(relay)
    down = relay.stats.downstream
    assert relay.stats.upstream.dropped == 0 and relay.stats.upstream.forwarded == 1000
    assert 0.33 < down.dropped / down.received < 0.47
    assert down.forwarded == 1000 - down.dropped
    await _settle(lambda: len(client.received) == down.forwarded)
    await relay.close()
    client_t.close()
    server_t.close()


async def test_outage_drops_everything_both_ways() -> None:
    server_t, server = await _endpoint(echo=True)
    relay = await start_relay(RelayConfig(target=server_t.get_extra_info("sockname"), outages=(Outage(0.0, 60.0),)))
    client_t, client = await _endpoint(remote=relay.listen_addr)
    for i in range(50):
        client_t.sendto(b"%d" % i)
    await _settle(lambda: relay.stats.upstream.received == 50)
    # the server also talks first, to the relay's upstream address for this client: dropped as well
    upstream_addr = relay.upstream_addr(client_t.get_extra_info("sockname"))
    assert upstream_addr is not None
    for i in range(20):
        server_t.sendto(b"s%d" % i, upstream_addr)
    await _settle(lambda: relay.stats.downstream.received == 20)
    await asyncio.sleep(0.05)
    assert server.received == [] and client.received == []
    assert relay.stats.upstream.outage_dropped == 50 and relay.stats.downstream.outage_dropped == 20
    await relay.close()
    client_t.close()
    server_t.close()


async def test_a_severed_path_stays_dead_and_a_new_client_passes() -> None:
    server_t, server = await _endpoint(echo=True)
    relay = await start_relay(RelayConfig(target=server_t.get_extra_info("sockname")))
    old_t, old = await _endpoint(remote=relay.listen_addr)
    old_t.sendto(b"before")
    await _settle(lambda: len(old.received) == 1)
    relay.sever()
    new_t, new = await _endpoint(remote=relay.listen_addr)  # a new socket: a new QUIC connection's
    await asyncio.sleep(1.0)  # longer than any outage would need: the old path does not come back by itself
    for i in range(10):
        old_t.sendto(b"old%d" % i)
        new_t.sendto(b"new%d" % i)
    await _settle(lambda: len(new.received) == 10 and relay.stats.upstream.outage_dropped == 10)
    await asyncio.sleep(0.05)
    assert [d for d, _, _ in old.received] == [b"before"] and len(new.received) == 10
    assert sorted(d for d, _, _ in server.received) == sorted([b"before", *(b"new%d" % i for i in range(10))])
    await relay.close()
    for transport in (old_t, new_t, server_t):
        transport.close()


async def test_each_client_gets_its_own_upstream_socket_and_its_replies() -> None:
    server_t, server = await _endpoint(echo=True)
    relay = await start_relay(RelayConfig(target=server_t.get_extra_info("sockname"),
                                          upstream=PathConfig(delay=0.005), downstream=PathConfig(delay=0.005)))
    clients = [await _endpoint(remote=relay.listen_addr) for _ in range(3)]
    for n, (transport, _) in enumerate(clients):
        for i in range(10):
            transport.sendto(b"c%d-%d" % (n, i))
    await _settle(lambda: all(len(c.received) == 10 for _, c in clients))
    assert relay.stats.clients == 3
    assert len({addr for _, addr, _ in server.received}) == 3  # one upstream socket per client
    for n, (_, collector) in enumerate(clients):
        assert [d for d, _, _ in collector.received] == [b"c%d-%d" % (n, i) for i in range(10)]  # FIFO, own only
    await relay.close()
    for transport, _ in clients:
        transport.close()
    server_t.close()


async def test_jitter_keeps_order_unless_reordering_is_asked_for() -> None:
    orders = {}
    for reorder in (False, True):
        server_t, server = await _endpoint()
        relay = await start_relay(RelayConfig(target=server_t.get_extra_info("sockname"), seed=3,
                                              upstream=PathConfig(delay=0.01, jitter=0.02, reorder=reorder)))
        client_t, _ = await _endpoint(remote=relay.listen_addr)
        for i in range(200):
            client_t.sendto(b"%d" % i)
        await _settle(lambda: len(server.received) == 200)
        orders[reorder] = [int(d) for d, _, _ in server.received]
        await relay.close()
        client_t.close()
        server_t.close()
    assert orders[False] == list(range(200))
    assert sorted(orders[True]) == list(range(200)) and orders[True] != list(range(200))


def test_hostport_parsing() -> None:
    assert parse_hostport("127.0.0.1:4433") == ("127.0.0.1", 4433)
    assert parse_hostport("[::1]:80") == ("::1", 80)
    for bad in ("localhost", "host:", ":80", "h:99999", "h:x"):
        with pytest.raises(ConfigError):
            parse_hostport(bad)


@pytest.mark.parametrize("argv,message", [
    (["--target", "nowhere"], "HOST:PORT"),
    (["--target", "127.0.0.1:9", "--loss", "1.5"], "loss rate"),
    (["--target", "127.0.0.1:9", "--outage", "3"], "START:DURATION"),
    (["--target", "127.0.0.1:9", "--loss-schedule", "0:0.3,0:0.1"], "strictly increase"),
    (["--target", "127.0.0.1:9", "--down-trace", "/nonexistent.trace"], "cannot read trace"),
    (["--target", "127.0.0.1:9", "--burst", "0.5"], "burst"),
])
def test_relay_cli_rejects_bad_input_with_exit_2(argv, message, capsys) -> None:  # type: ignore[no-untyped-def]
    try:
        code = main(["relay", *argv])
    except SystemExit as exc:  # numbers are refused by argparse itself, while parsing
        code = exc.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_relay_cli_runs_and_reports(capsys) -> None:  # type: ignore[no-untyped-def]
    assert main(["relay", "--listen", "127.0.0.1:0", "--target", "127.0.0.1:9", "--duration", "0.1",
                 "--up-loss", "0.1", "--down-delay-ms", "20", "--outage", "1:2"]) == 0
    assert "0 clients" in capsys.readouterr().err
