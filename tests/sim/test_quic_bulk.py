"""The simulator's QUIC bulk download (``sim.quic_bulk``): aioquic's recovery, CUBIC and pacer over the trace queue,
the cross flow ``bench e2e --trace --cross`` runs end to end."""

from __future__ import annotations

import pytest

from eloquent_plugins.cli.main import main
from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.protocol import QUIC_MAX_DATAGRAM_SIZE
from eloquent_plugins.sim.clock import EventLoop
from eloquent_plugins.sim.links import LINK_RTT_MS, BulkFlow
from eloquent_plugins.sim.netem import CapacityLink, Link, PathConfig, parse_mahimahi
from eloquent_plugins.sim.quic_bulk import PAYLOAD, QuicBulkFlow, bulk_flow
from eloquent_plugins.sim.quic_window import IP_UDP
from eloquent_plugins.sim.scenario import Scenario, parse_scenario

STEADY = "\n".join(str(i) for i in range(0, 1000, 2))
"""One 1500-byte opportunity every 2 ms: 6 Mbit/s."""
OUTAGE = "\n".join(str(i) for i in [*range(0, 3000, 2), *range(5000, 8000, 2)])
"""The same with nothing from 3 to 5 s (repeating every 8 s)."""
GOODPUT = 6e6 * PAYLOAD / (IP_UDP + QUIC_MAX_DATAGRAM_SIZE)
"""The steady link's rate in body bytes of full QUIC packets."""


def _flow(kind: str, down: str) -> BulkFlow | QuicBulkFlow:
    loop = EventLoop()
    forward = Link(PathConfig(delay=0.03, capacity=CapacityLink(parse_mahimahi(down, "d"), queue_packets=100)))
    reverse = Link(PathConfig(delay=0.03, capacity=CapacityLink(parse_mahimahi(STEADY, "u"), queue_packets=100)))
    flow = bulk_flow(kind, loop, forward, reverse, start=0.0, stop=12.0, window=(2.0, 10.0), rtt=0.1)
    loop.run(60.0)
    return flow


def test_the_quic_flow_fills_a_steady_link() -> None:
    flow = _flow("quic", STEADY)
    assert isinstance(flow, QuicBulkFlow)
    assert flow.throughput() >= 0.9 * GOODPUT
    assert flow.throughput() <= GOODPUT * 1.01  # the trace repeats every 998 ms: 501 opportunities a second
    assert flow.loss < 0.02  # CUBIC settles below the queue's limit


def test_after_an_outage_the_quic_flow_is_back_where_tcp_waits_out_its_timer() -> None:
    """Why the simulator needs this flow to compare with end to end: over a 2 s outage QUIC's probe timeout finds
    the link again at once, TCP's backed-off retransmission timer fires late, so the QUIC flow keeps the shared
    queue full where the TCP flow leaves it empty."""
    quic, tcp = _flow("quic", OUTAGE), _flow("tcp", OUTAGE)
    possible = GOODPUT * 6 / 8  # the window [2, 10) s has 6 s of link
    assert quic.throughput() >= 0.8 * possible
    assert tcp.throughput() <= 0.85 * quic.throughput()


def test_the_cross_flow_is_chosen_by_name_and_checked() -> None:
    with pytest.raises(ConfigError, match="unknown cross flow 'udp'"):
        _flow("udp", STEADY)
    assert parse_scenario("link=X,cross=1,flow=quic").cross_flow == "quic"
    quic = Scenario(loss=0.0, link="X", cross=1, cross_flow="quic", rtt_ms=LINK_RTT_MS)
    assert quic.label == "link=X,cross=1,flow=quic"
    assert Scenario(loss=0.0, link="X", cross=1, rtt_ms=LINK_RTT_MS).label == "link=X,cross=1"
    assert Scenario(loss=0.0, link="X", cross=1).label == "link=X,cross=1,rtt=100"  # not the links' base RTT: said
    with pytest.raises(ConfigError, match="flow must be one of tcp, quic"):
        Scenario(link="X", cross=1, cross_flow="udp")


def test_bench_sim_links_runs_the_quic_cross_flow(tmp_path, monkeypatch, capsys) -> None:
    for name, text in (("Steady", STEADY),):
        (tmp_path / f"{name}.down").write_text(text + "\n")
        (tmp_path / f"{name}.up").write_text(text + "\n")
    monkeypatch.setenv("ELOQUENT_TRACES_DIR", str(tmp_path))
    assert main(["bench", "sim", "--links", "traces", "--trace", "Steady", "--cross", "1", "--cross-flow", "quic",
                 "--seeds", "1", "--streams", "1", "--tokens", "40", "--jobs", "1", "--no-progress"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("link=Steady,cross=1,flow=quic"))
    assert row.split()[1] == "eloquent"
    cross_mbps = float(row.split()[-4])
    assert 0.5 * GOODPUT / 1e6 <= cross_mbps <= GOODPUT / 1e6
