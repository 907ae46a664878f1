"""Real links (issue 30): the trace-driven bottleneck both the simulator and the relay use, the simulator's bulk
cross flow, and the two benches over cellular traces."""

from __future__ import annotations

import asyncio
import json
import math
import statistics
import time

import pytest

from eloquent_plugins.cli.main import main
from eloquent_plugins.sim.netem import (CapacityLink, CapacityTraceError, Link, PathConfig, PathModel, TraceQueue,
                                        parse_mahimahi)
from eloquent_plugins.cli.bench.sim_links import LINK_RTT_MS, LINK_WINDOW
from eloquent_plugins.sim.clock import EventLoop, SimulationError
from eloquent_plugins.sim.links import WARMUP, load_real_link, request_delay, stream_span
from eloquent_plugins.sim.run import simulate_stream
from eloquent_plugins.sim.scenario import Scenario
from eloquent_plugins.sim.udp_relay import RelayConfig, start_relay

MTU = 1500


def _queue(text: str, **kw: object) -> TraceQueue:
    return TraceQueue(CapacityLink(parse_mahimahi(text, "t"), **kw))  # type: ignore[arg-type]


def test_a_fixed_rate_trace_gives_its_rate() -> None:
    q = _queue("1\n")  # one 1500-byte opportunity per millisecond: 12 Mbit/s
    departures = [q.offer(0.0, MTU) for _ in range(1000)]
    assert departures == pytest.approx([(i + 1) / 1000 for i in range(1000)])
    rate = 1000 * MTU * 8 / departures[-1]
    assert rate == pytest.approx(12e6)
    # Small packets share an opportunity; a large one spans two.
    q = _queue("1\n")
    assert [q.offer(0.0, 500) for _ in range(3)] == pytest.approx([0.001] * 3)
    assert q.offer(0.0, 2000) == pytest.approx(0.003)
    # An opportunity that finds the queue empty is lost: a packet offered later takes the next one.
    q = _queue("1\n")
    assert q.offer(0.0105, MTU) == pytest.approx(0.011)


def test_a_two_second_gap_delays_everything_queued_by_the_gap() -> None:
    before = list(range(0, 100))  # one per ms for 100 ms ...
    after = list(range(2100, 3000))  # ... then nothing for 2 s, then one per ms again
    gapped = _queue("\n".join(map(str, before + after)))
    plain = _queue("\n".join(map(str, range(0, 1000))) + "\n1000")
    for i in range(300):  # 300 packets at once: 100 leave before the gap, 200 after it
        a, b = gapped.offer(0.0, MTU), plain.offer(0.0, MTU)
        assert a is not None and b is not None
        if i < 100:
            assert a == pytest.approx(b)
        else:
            assert a - b == pytest.approx(2.0)


def test_the_trace_repeats_at_its_end() -> None:
    trace = parse_mahimahi("0\n5\n10", "t")
    assert trace.period == pytest.approx(0.010)
    q = TraceQueue(CapacityLink(trace))
    assert q.offer(1.0001, MTU) == pytest.approx(1.005)  # 100 periods on: the trace's 5 ms opportunity
    assert trace.mean_rate == pytest.approx(3 * MTU * 8 / 0.010)


def test_drops_only_when_the_queue_is_full() -> None:
    q = _queue("1\n", queue_packets=10)
    fates = [q.offer(0.0, MTU) for _ in range(20)]
    assert [f is not None for f in fates] == [True] * 10 + [False] * 10
    assert q.stats.tail_drops == 10
    assert q.offer(0.0015, MTU) is not None  # one left at 1 ms: room for one more
    assert q.offer(0.0015, MTU) is None
    # Offered below capacity (one packet per 2 ms into one opportunity per ms): never a drop.
    q = _queue("1\n", queue_packets=2)
    assert all(q.offer(i * 0.002, MTU) is not None for i in range(2000)) and q.drops == 0
    # A byte limit counts bytes: four 400-byte packets fit under 1600, the fifth does not.
    q = _queue("1000\n", queue_bytes=1600)
    assert [q.offer(0.0, 400) is not None for _ in range(5)] == [True] * 4 + [False]


def test_codel_drops_a_standing_queue_that_drop_tail_keeps() -> None:
    plain, codel = _queue("2\n", queue_packets=2000), _queue("2\n", queue_packets=2000, codel=True)
    for i in range(3000):  # twice the capacity for 3 s: a standing queue
        plain.offer(i * 0.001, MTU)
        codel.offer(i * 0.001, MTU)
    assert plain.drops == 0 and codel.stats.codel_drops > 0


@pytest.mark.parametrize("text, fragment", [("", "no delivery"), ("1\nx", "t:2: expected a time"),
                                            ("5\n3", "t:2: times must not decrease"), ("0\n0", "last time")])
def test_bad_capacity_traces_are_typed_and_located(text: str, fragment: str) -> None:
    with pytest.raises(CapacityTraceError, match=fragment):
        parse_mahimahi(text, "t")


def test_the_path_counts_queue_drops_apart_from_loss() -> None:
    link = CapacityLink(parse_mahimahi("10\n", "t"), queue_packets=3)
    model = PathModel(PathConfig(delay=0.02, capacity=link), seed=1)
    arrivals = [model.transmit(0.0, MTU) for _ in range(5)]
    assert arrivals[:3] == pytest.approx([0.03, 0.04, 0.05]) and arrivals[3:] == [None, None]
    assert model.stats.queue_drops == 2 and model.stats.lost == 0


class _Sink(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        self.got: dict[int, float] = {}

    def datagram_received(self, data: bytes, addr: object) -> None:
        self.got[int(data[:8].decode())] = time.monotonic()


async def test_the_relay_and_the_simulator_agree_on_a_trace() -> None:
    """The same packets into the relay and into the simulator's path model (same config, same seed): the same
    packets dropped, and the relay's releases within 50 ms (median) of the model's times, the stated tolerance
    (the relay's timers run on a real, shared clock)."""
    loop = asyncio.get_running_loop()
    link = CapacityLink(parse_mahimahi("0\n4\n8\n12\n16\n20", "t"), queue_packets=40)  # 6 per 20 ms (0 and 20 both): 3.6 Mbit/s
    path = PathConfig(delay=0.01, capacity=link)
    server_t, server = await loop.create_datagram_endpoint(_Sink, local_addr=("127.0.0.1", 0))
    relay = await start_relay(RelayConfig(target=server_t.get_extra_info("sockname"), upstream=path, seed=7,
                                          record=True))
    client_t, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, remote_addr=relay.listen_addr)
    try:
        for i in range(240):  # bursts of 60 every 100 ms: twice the capacity, the queue overflows
            client_t.sendto(b"%08d" % i + bytes(1000))
            if i % 60 == 59:
                await asyncio.sleep(0.1)
        records = relay.record_of(0, "up")
        deadline = loop.time() + 30
        while (len(records) < 240 or len(server.got) < sum(1 for r in records if not r.dropped)) \
                and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert len(records) == 240
        model = PathModel(path, seed=7)
        expected = [model.transmit(r.received, r.size) for r in records]
        assert [e is None for e in expected] == [r.dropped for r in records]
        assert any(r.dropped for r in records) and not all(r.dropped for r in records)
        errors = [abs(server.got[i] - relay.origin - e) for i, e in enumerate(expected) if e is not None]
        assert len(errors) == sum(1 for e in expected if e is not None)
        assert statistics.median(errors) < 0.05
    finally:
        client_t.close()
        await relay.close()
        server_t.close()


async def test_the_relay_keeps_what_comes_before_trace_from_off_the_trace() -> None:
    """A bench's handshakes stay off the stretch of trace under test: with ``trace_from`` at infinity a packet
    passes an uplink with no opportunity for 3 s after only the path's delay; once ``trace_from`` is set, the next
    one waits for the trace's first opportunity as before."""
    loop = asyncio.get_running_loop()
    gap = CapacityLink(parse_mahimahi("3000\n3002", "t"), queue_packets=10)
    server_t, server = await loop.create_datagram_endpoint(_Sink, local_addr=("127.0.0.1", 0))
    relay = await start_relay(RelayConfig(target=server_t.get_extra_info("sockname"),
                                          upstream=PathConfig(delay=0.01, capacity=gap), record=True))
    client_t, _ = await loop.create_datagram_endpoint(asyncio.DatagramProtocol, remote_addr=relay.listen_addr)
    try:
        relay.trace_from = math.inf
        client_t.sendto(b"%08d" % 0)
        deadline = loop.time() + 10
        while 0 not in server.got and loop.time() < deadline:
            await asyncio.sleep(0.01)
        assert server.got[0] - relay.origin < 1.0  # 10 ms on an idle machine: nowhere near the trace's 3 s
        relay.trace_from = relay.elapsed()
        client_t.sendto(b"%08d" % 1)
        while 1 not in server.got and loop.time() < deadline:
            await asyncio.sleep(0.05)
        assert server.got[1] - relay.origin >= 3.0
        assert [r.dropped for r in relay.record_of(0, "up")] == [False, False]
    finally:
        client_t.close()
        await relay.close()
        server_t.close()


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Two small synthetic trace pairs (the real ones are read from shared/, not part of the repository)."""
    folder = tmp_path_factory.mktemp("traces")
    steady = "\n".join(str(i) for i in range(0, 1000, 2))  # 6 Mbit/s
    outage = "\n".join(str(i) for i in [*range(0, 600, 2), *range(2600, 3000, 2)])  # a 2 s outage
    for name, text in (("Steady", steady), ("Outage", outage)):
        (folder / f"{name}.down").write_text(text + "\n")
        (folder / f"{name}.up").write_text(steady + "\n")
    return str(folder)


def test_bench_sim_links_runs_every_scheme_with_cross_traffic(traces: str, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ELOQUENT_TRACES_DIR", traces)
    out = tmp_path / "links.json"
    assert main(["bench", "sim", "--links", "traces", "--trace", "Steady", "--trace", "Outage", "--seeds", "1",
                 "--streams", "1", "--tokens", "40", "--jobs", "1", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    rows = {r["label"]: r["schemes"] for r in doc["rows"]}
    assert set(rows) == {"link=Steady,cross=0", "link=Steady,cross=1", "link=Outage,cross=0",
                         "link=Outage,cross=1"}
    for label, schemes in rows.items():
        assert set(schemes) == {"eloquent", "eloquent-adaptive", "retransmission", "duplication"}
        for figures in schemes.values():
            assert 0.0 <= figures["stall"] <= figures["stall_raw"] + 1e-9 <= 1.0 + 1e-9
            assert (figures["cross_bps"] is not None) == label.endswith("cross=1")
            if label.endswith("cross=1"):
                assert 0 <= figures["cross_bps"] <= 6e6 * 1.01  # never more than the link carries
                assert figures["cross_bps"] > 0 or label.startswith("link=Outage")  # its window is the outage
    # The outage costs the raw stall (the link's own), not the stall above the link's floor, for Eloquent.
    assert rows["link=Outage,cross=0"]["eloquent"]["stall_raw"] > rows["link=Steady,cross=0"]["eloquent"]["stall_raw"]
    assert "link=Outage,cross=1" in capsys.readouterr().out


def test_bench_sim_links_sets_the_links_base_round_trip(traces: str, tmp_path, monkeypatch) -> None:
    """``--link-rtt``: the first token comes the extra half round trip later and the row says its RTT."""
    monkeypatch.setenv("ELOQUENT_TRACES_DIR", traces)
    first = {}
    for rtt in ("60", "260"):
        out = tmp_path / f"links-{rtt}.json"
        assert main(["bench", "sim", "--links", "traces", "--trace", "Steady", "--cross", "0", "--seeds", "1",
                     "--streams", "1", "--tokens", "20", "--jobs", "1", "--link-rtt", rtt, "--no-progress",
                     "--json", str(out)]) == 0
        (row,) = json.loads(out.read_text())["rows"]
        assert row["label"] == ("link=Steady,cross=0" if rtt == "60" else "link=Steady,cross=0,rtt=260")
        first[rtt] = row["schemes"]["eloquent"]["first_token"]
    assert 0.09 <= first["260"] - first["60"] <= 0.11  # one way: 100 ms more (first token in seconds)


def test_bench_sim_links_refuses_a_zero_link_rtt(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "sim", "--links", "traces", "--link-rtt", "0"])
    assert "--link-rtt" in capsys.readouterr().err


def test_bench_sim_against_an_e2e_run_pairs_its_streams(traces: str, tmp_path, monkeypatch, capsys) -> None:
    """A real e2e run of two streams on the Outage trace, then the simulator's same streams beside it: the e2e
    figure is the run's own, the interval holds the ratio; a row that does not run as the e2e run did, or that
    lacks its streams, is refused before the simulator runs, naming what to change."""
    monkeypatch.setenv("ELOQUENT_TRACES_DIR", traces)
    e2e = tmp_path / "e2e.json"
    assert main(["bench", "e2e", "--trace", "Outage", "--requests", "2", "--tokens", "20", "--rtt", "0.06",
                 "--scheme", "eloquent", "--no-progress", "--json", str(e2e)]) == 0
    doc = json.loads(e2e.read_text())
    capsys.readouterr()
    base = ["bench", "sim", "--links", "traces", "--trace", "Outage", "--cross", "0", "--streams", "1",
            "--jobs", "1", "--no-progress", "--against", str(e2e)]
    out = tmp_path / "sim.json"
    assert main([*base, "--seeds", "2", "--tokens", "20", "--decode", "steady", "--json", str(out)]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("against "))
    assert "link=Outage,cross=0,decode=steady end to end (2 streams)" in line
    compared = json.loads(out.read_text())["against"]
    own = [s["stall_net"] for s in doc["per_stream"]["eloquent"]]
    assert compared["e2e"] == pytest.approx(sum(own) / 2)
    assert compared["streams"] == 2 and 0.0 <= compared["sim"] <= 1.0
    if compared["sim"] > 0:
        assert compared["low"] <= compared["ratio"] <= compared["high"]

    # A file written before meta.run existed: its command line is read as bench e2e reads it.
    legacy = tmp_path / "legacy.json"
    legacy.write_text(json.dumps(doc | {"meta": {"argv": ["bench", "e2e", "--trace", "Outage", "--requests", "2",
                                                          "--tokens", "20", "--rtt", "0.06", "--scheme", "eloquent"]}}))
    assert main([*base[:-1], str(legacy), "--seeds", "2", "--tokens", "20", "--decode", "steady"]) == 0
    assert line in capsys.readouterr().out

    assert main([*base, "--seeds", "2", "--tokens", "30", "--decode", "steady"]) != 0
    err = capsys.readouterr().err
    assert "--tokens 20" in err and "stall" not in err  # refused before any row ran
    assert main([*base, "--seeds", "2", "--tokens", "20"]) != 0
    assert "--decode steady" in capsys.readouterr().err
    assert main([*base, "--seeds", "2", "--tokens", "20", "--decode", "steady", "--codel"]) != 0
    assert "no --codel" in capsys.readouterr().err
    assert main([*base, "--seeds", "1", "--tokens", "20", "--decode", "steady"]) != 0
    assert "1 of the e2e run's 2 streams are not among the simulator's" in capsys.readouterr().err
    assert main([*base[:-1], str(tmp_path / "none.json"), "--seeds", "2"]) != 0
    assert "cannot read" in capsys.readouterr().err


def test_an_unbounded_ratio_is_written_as_null() -> None:
    """A row whose simulated streams all stall 0 has no finite ratio: its JSON stays plain JSON."""
    from eloquent_plugins.cli.bench.sim_against import Against

    figures = Against("link=X,cross=0", 2, 0.004, 0.0, math.inf, math.inf).as_dict()
    assert figures["ratio"] is None and figures["low"] is None and figures["high"] is None
    assert json.loads(json.dumps(figures, allow_nan=False))["e2e"] == 0.004


def test_bench_sim_links_names_a_missing_trace(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ELOQUENT_TRACES_DIR", str(tmp_path))
    assert main(["bench", "sim", "--links", "traces", "--trace", "Nowhere", "--seeds", "1"]) != 0
    assert "Nowhere.down" in capsys.readouterr().err


def test_bench_e2e_trace_with_a_bulk_download(traces: str, tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ELOQUENT_TRACES_DIR", traces)
    out_json = tmp_path / "row.json"
    assert main(["bench", "e2e", "--trace", "Steady", "--cross", "--requests", "1", "--tokens", "20",
                 "--no-cross-baseline", "--no-progress", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "text identical: True, all completed: True" in out
    assert "each scheme alone, each request on its own relay" in out
    row = next(line for line in out.splitlines() if line.startswith("link=Steady,cross=1"))
    assert float(row.split()[-3]) > 0  # the bulk download's Mbit/s
    doc = json.loads(out_json.read_text())
    assert set(doc["schemes"]) == set(doc["terms_ms"]) == {"eloquent", "retransmission", "duplication"}
    for scheme, figures in doc["schemes"].items():
        assert 0.0 <= figures["stall_net"] <= 1.0
        assert figures["cross_bps"] > 0  # each scheme had its own download beside it
        assert all(doc["terms_ms"][scheme][k] >= 0 for k in ("pre", "net", "post"))
    # Request 0's first token is generated near the simulator's stream 0 (WARMUP s into the trace).
    assert all(abs(shift) < 1.0 for shift in doc["first_token_shift"])


def test_bench_e2e_trace_runs_each_request_on_its_own_path(traces: str, tmp_path, monkeypatch, capsys) -> None:
    """Like the simulator's streams, each request gets a fresh relay whose trace starts where the simulator's
    stream of that index starts; ``--one-path`` runs them one after another on one relay from the run's offset."""
    monkeypatch.setenv("ELOQUENT_TRACES_DIR", traces)
    span = stream_span(10, 0.03, 0.0)
    docs = {}
    for mode in ("fresh", "one"):
        out_json = tmp_path / f"{mode}.json"
        argv = ["bench", "e2e", "--trace", "Steady", "--scheme", "eloquent", "--requests", "2", "--tokens", "10",
                "--tpot", "0.03", "--ttft", "0", "--seed", "2", "--no-progress", "--json", str(out_json)]
        assert main(argv + (["--one-path"] if mode == "one" else [])) == 0
        out = capsys.readouterr().out
        assert "text identical: True, all completed: True" in out
        assert ("each request on its own relay" in out) == (mode == "fresh")
        docs[mode] = json.loads(out_json.read_text())
        assert len(docs[mode]["first_token_shift"]) == 2
        assert all(abs(shift) < 1.0 for shift in docs[mode]["first_token_shift"])
    # seed 2 of 2 requests: the simulator's streams 2 and 3.
    assert docs["fresh"]["path_offsets"] == pytest.approx([2 * span, 3 * span])
    assert docs["one"]["path_offsets"] == pytest.approx([2 * span])


def test_bench_e2e_trace_shared_queue_one_scheme(traces: str, monkeypatch, capsys) -> None:
    monkeypatch.setenv("ELOQUENT_TRACES_DIR", traces)
    assert main(["bench", "e2e", "--trace", "Outage", "--shared-queue", "--scheme", "eloquent", "--requests", "1",
                 "--tokens", "20", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "one relay for all" in out
    row = next(line for line in out.splitlines() if line.startswith("link=Outage,cross=0"))
    assert row.split()[1] == "eloquent"
    assert "retransmission" not in out and "duplication" not in out


def test_bench_sim_links_recarry_bounds_and_limit(traces: str, tmp_path, monkeypatch) -> None:
    """What re-carrying costs: Eloquent sends more than without re-carrying, which sends more than one packet per
    token; with ``--recarry-limit 1`` Eloquent sends as the variant without it does, and still renders everything."""
    monkeypatch.setenv("ELOQUENT_TRACES_DIR", traces)
    rows = {}
    for limit in ("1", "0"):  # 1 byte: past it at once; 0: no limit
        out = tmp_path / f"bounds{limit}.json"
        assert main(["bench", "sim", "--links", "traces", "--trace", "Outage", "--cross", "1", "--seeds", "1",
                     "--streams", "1", "--tokens", "60", "--jobs", "1", "--recarry-bounds", "--recarry-limit", limit,
                     "--json", str(out)]) == 0
        rows[limit] = json.loads(out.read_text())["rows"][0]["schemes"]
    plain = rows["0"]
    assert plain["once"]["bytes"] < plain["eloquent-new-only"]["bytes"] < plain["eloquent"]["bytes"]
    assert plain["once"]["stall"] <= plain["eloquent"]["stall"] + 1e-9  # a bound: each packet renders all before
    capped = rows["1"]
    assert capped["eloquent"]["bytes"] < plain["eloquent"]["bytes"]
    assert capped["eloquent"]["bytes"] == pytest.approx(capped["eloquent-new-only"]["bytes"], rel=0.1)


def test_the_stream_starts_when_its_request_got_up_the_link(tmp_path) -> None:
    """As end to end, the simulated stream's first token waits for its request to cross the uplink: an uplink with
    no opportunity from 1.0 to 2.6 s holds the request (sent 1.77 s in: the first token is due at ``WARMUP`` = 2 s,
    less the engine's 0.2 s and the one-way 30 ms) until 2.6 s, so every token comes 0.83 s later than over an
    uplink with opportunities all along; the downlink and the tokens' spacing are the same."""
    steady = "\n".join(str(i) for i in range(0, 6000, 2))
    gap = "\n".join(str(i) for i in [*range(0, 1000, 2), *range(2600, 6000, 2)])
    for name, up in (("Up", steady), ("UpGap", gap)):
        (tmp_path / f"{name}.down").write_text(steady + "\n")
        (tmp_path / f"{name}.up").write_text(up + "\n")
    runs = {}
    for name in ("Up", "UpGap"):
        scenario = Scenario(loss=0.0, rtt_ms=LINK_RTT_MS, tokens=30, streams=1, link=name, cross=0,
                            queue_packets=100, window=LINK_WINDOW)
        runs[name] = simulate_stream(scenario, 1, 0, None, ("eloquent", "retransmission"),
                                     load_real_link(str(tmp_path / name)))
    for scheme in ("eloquent", "retransmission"):
        steady_run, held = runs["Up"][scheme], runs["UpGap"][scheme]
        assert steady_run.generated[0] == pytest.approx(WARMUP, abs=0.003)
        assert held.generated[0] == pytest.approx(WARMUP + 0.83, abs=0.003)
        assert [b - a for a, b in zip(steady_run.generated, held.generated)] == pytest.approx(
            [held.generated[0] - steady_run.generated[0]] * len(held.generated))
        assert len(held.rendered) == 30 and all(r >= g for g, r in zip(held.generated, held.rendered))


def test_a_request_the_uplink_always_drops_is_a_simulation_error(tmp_path) -> None:
    """The request's retries are bounded: an uplink whose one-packet queue is full and whose next opportunity is
    100 s away drops every send, and the run ends with a typed error naming the cause, not a loop without end."""
    (tmp_path / "Stuck.down").write_text("2\n")
    (tmp_path / "Stuck.up").write_text("100000\n")
    _, up = load_real_link(str(tmp_path / "Stuck"), queue_packets=1).paths(PathConfig(delay=0.03), 0.0)
    full = Link(up)
    assert full.through(0.5, 1500) == pytest.approx(100.03)  # the queue's one place, taken until 100 s
    with pytest.raises(SimulationError, match="dropped by the uplink's full queue 20 times from 1.8 s"):
        request_delay(EventLoop(), full, 1.77, retry=0.18)
    assert request_delay(EventLoop(), Link(up), 1.77, retry=0.18) == pytest.approx(100 - 1.77, abs=0.01)
