"""``bench datapath`` (issue 19, item 2), run tiny: the real HTTP/3 stack on a virtual clock, where packet counts
are exact whatever the machine's load. What it guards: the front end sends one packet per token on the datagram
path, as on the reliable stream (its QUIC ACK of the client's ack datagram rides in the next token's packet), and
the client sends its ack datagram and, 1 ms later, QUIC's ACK."""

from __future__ import annotations

import json
from pathlib import Path

from eloquent_plugins.cli.bench import datapath
from eloquent_plugins.cli.bench.virtual_clock import VirtualLoop


def test_tiny_run_prints_and_writes_figures(tmp_path: Path, capsys: object) -> None:
    out = tmp_path / "datapath.json"
    assert datapath.main(["--tokens", "30", "--repeats", "1", "--no-progress", "--json", str(out)]) == 0
    figures = json.loads(out.read_text())
    live = {scheme: figures["live"][scheme]["median"] for scheme in datapath.SCHEMES}
    for scheme in datapath.SCHEMES:
        (run,) = figures["live"][scheme]["runs"]
        assert run["tokens"] >= 30  # every event read (the engine adds its closing events)
        assert live[scheme]["server_us"] > 0 and live[scheme]["client_us"] > 0
    # Two datagrams down per token: the token's, and QUIC's ACK of the client's ack datagram, sent as soon as the
    # ack arrives (in the next token's packet it delayed that token's send and render: docs/results/e2e-vs-sim.md).
    assert abs(live["eloquent"]["down_packets"] - (live["stream"]["down_packets"] + 1)) <= 0.2
    # Up: the ack datagram and QUIC's ACK, each per token (the stream path: QUIC's ACK only).
    assert live["eloquent"]["up_packets"] <= 2 * live["stream"]["up_packets"] + 0.2
    assert figures["core_us"]["median"] > 0
    assert "core (response stream + assembler" in capsys.readouterr().out  # type: ignore[attr-defined]


def test_core_run_renders_every_event() -> None:
    rendered, sent = datapath.core_once(50, rtt=0.1, tpot=0.03)
    assert rendered == 51  # 50 events and the final one
    assert sent >= 51


def test_virtual_loop_moves_time_without_waiting() -> None:
    loop = VirtualLoop()
    try:
        async def sleep_long() -> float:
            import asyncio

            await asyncio.sleep(3600)
            return loop.time()

        assert loop.run_until_complete(sleep_long()) >= 3600
    finally:
        loop.close()
