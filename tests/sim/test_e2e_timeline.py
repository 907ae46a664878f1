"""Issue 19's instrumentation: per-token timelines from an end-to-end run and a simulated one, the relay's
recorded drop pattern replayed in the simulator, and the side-by-side plot. Shape only; the figures are in
docs/results/e2e-vs-sim.md."""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

import pytest

from eloquent_plugins.cli.bench import timeline
from eloquent_plugins.cli.bench.e2e import Conditions, Workload, run_e2e
from eloquent_plugins.sim.netem import PathConfig, PathModel, parse_trace
from eloquent_plugins.sim.relay_record import Bottleneck, PacketRecord, SharedQueue, fate_trace_text
from eloquent_plugins.sim.scenario import Scenario
from eloquent_plugins.sim.timeline_record import SEND_FIELDS, TOKEN_FIELDS, simulated_stream


def check_rows(rows: list[dict], tokens: int) -> None:  # type: ignore[type-arg]
    assert len(rows) == tokens > 0
    for i, row in enumerate(rows):
        assert set(TOKEN_FIELDS) <= set(row) and row["index"] == i
        assert row["rendered"] >= row["generated"]


def check_datagram_rows(rows: list[dict], fallback: bool = False) -> None:  # type: ignore[type-arg]
    """``fallback``: a token may have been delivered by none of its datagrams (resent on the reliable stream)."""
    for row in rows:
        assert row["sends"] and row["first_send"] is not None
        assert fallback or row["delivered_by"] is not None
        for send in row["sends"]:
            assert set(SEND_FIELDS) <= set(send)
        assert timeline.terms(row) is not None


async def test_e2e_timeline_replays_the_relays_drops_and_plots(tmp_path: Path) -> None:
    result = await run_e2e(Conditions(loss=0.10, burst=2.0, rtt=0.1, seed=3),
                           Workload(requests=1, max_tokens=40, ttft=0.05, tpot=0.02), record=True)
    assert {t["scheme"] for t in result.timelines} == {"eloquent", "stream", "duplicate"}
    for entry, stream in zip(result.timelines, result.streams):
        assert entry["error"] is None
        check_rows(entry["e2e"], len(stream.rendered))
        if entry["scheme"] != "stream":
            check_datagram_rows(entry["e2e"], fallback=True)
            assert any(s["relay_in"] is not None for row in entry["e2e"] for s in row["sends"])
    eloquent = next(t for t in result.timelines if t["scheme"] == "eloquent")
    check_rows(eloquent["sim"], len(eloquent["e2e"]))
    check_datagram_rows(eloquent["sim"])
    a = timeline.attribution(result.timelines)
    assert set(a["terms_ms"]["e2e"]) == set(timeline.TERMS) and "simulator, replayed drops" in a["stall_ratio"]
    args = types.SimpleNamespace(timeline=str(tmp_path / "t.json"), plot=str(tmp_path / "t.png"))
    timeline.report(args, result)
    data = json.loads((tmp_path / "t.json").read_text())
    assert len(data["streams"]) == 3 and data["attribution"]["streams"] == 1
    if importlib.util.find_spec("matplotlib") is not None:
        assert (tmp_path / "t.png").stat().st_size > 1000


def test_recorded_drop_pattern_replays_with_the_same_drops() -> None:
    # A relay-style record (times in seconds since its start, some packets dropped), replayed as a trace from
    # t = 1.0: a path sending at the same instants (or within a quarter gap of them) meets the same drops.
    pattern = [False, True, True, False, False, True, False, False, False, True, False, True]
    records = [PacketRecord(1.0 + 0.03 * k, 100, None if lost else 1.05 + 0.03 * k, "loss" if lost else "")
               for k, lost in enumerate(pattern)]
    records.insert(0, PacketRecord(0.5, 100, None, "loss"))  # before the window: ignored
    trace = parse_trace(fate_trace_text(records, start=1.0), "replay")
    for shift in (0.0, 0.007, -0.007):
        model = PathModel(PathConfig(delay=0.05, trace=trace), seed=9)
        replayed = [model.transmit(max(0.0, 0.03 * k + shift), 100) is None for k in range(len(pattern))]
        assert replayed == pattern


def test_shared_bottleneck_drops_on_queue_overflow() -> None:
    q = SharedQueue(Bottleneck(rate=80_000, queue=1000))  # 10 kB/s, 1 kB queue
    fates = [q.depart(0.0, 300) for _ in range(6)]
    assert fates[:3] == pytest.approx([0.03, 0.06, 0.09]) and fates[4] is None and q.drops >= 2
    assert q.depart(1.0, 300) == pytest.approx(1.03)  # drained


def test_sim_timeline_has_every_token() -> None:
    entry = simulated_stream(Scenario(loss=0.1, burst=2.0, rtt_ms=100, tpot_ms=30, tokens=50, streams=1), 1, 0)
    check_rows(entry["sim"], 50)
    check_datagram_rows(entry["sim"])
    assert any(s["dropped"] for row in entry["sim"] for s in row["sends"])
