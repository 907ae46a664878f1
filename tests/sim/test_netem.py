"""The network models the simulator and the relay share: Gilbert-Elliott statistics, traces, schedules, paths."""

from __future__ import annotations

import random

import pytest

from eloquent_plugins.core.errors import ConfigError, EloquentError
from eloquent_plugins.sim.netem import (GilbertElliott, LossProcess, Outage, PathConfig, PathModel, SlottedPath,
                                    TraceError, load_trace, parse_loss_schedule, parse_outage, parse_trace)


def _bursts(losses: list[bool]) -> list[int]:
    runs, current = [], 0
    for lost in losses:
        if lost:
            current += 1
        elif current:
            runs.append(current)
            current = 0
    if current:
        runs.append(current)
    return runs


@pytest.mark.parametrize("loss,burst", [(0.01, 1.0), (0.05, 4.0), (0.1, 1.0), (0.2, 3.0), (0.2, 4.0)])
def test_gilbert_elliott_long_run_loss_and_burst_match_parameters(loss: float, burst: float) -> None:
    process = LossProcess(GilbertElliott(loss, burst), random.Random(1234))
    samples = [process.lost() for _ in range(300_000)]
    measured_loss = sum(samples) / len(samples)
    runs = _bursts(samples)
    assert measured_loss == pytest.approx(loss, rel=0.08)
    assert sum(runs) / len(runs) == pytest.approx(burst, rel=0.08)


def test_gilbert_elliott_multi_step_forgets_towards_the_loss_rate() -> None:
    # After a long silence the chain is back in its stationary distribution, whatever state it was in.
    rng = random.Random(5)
    hits = 0
    for _ in range(20_000):
        process = LossProcess(GilbertElliott(0.2, 8.0), rng)
        process.lost()
        process.bad = True
        hits += process.lost(steps=500)
    assert hits / 20_000 == pytest.approx(0.2, abs=0.02)
    stays = 0
    for _ in range(20_000):  # one step from Bad stays Bad with probability 1 - 1/burst
        process = LossProcess(GilbertElliott(0.2, 8.0), rng)
        process.lost()
        process.bad = True
        stays += process.lost(steps=1)
    assert stays / 20_000 == pytest.approx(1 - 1 / 8, abs=0.02)


@pytest.mark.parametrize("loss,burst", [(1.0, 1.0), (-0.1, 1.0), (0.1, 0.5), (0.6, 1.0)])
def test_gilbert_elliott_rejects_impossible_parameters(loss: float, burst: float) -> None:
    with pytest.raises(ConfigError):
        GilbertElliott(loss, burst)


def test_zero_loss_never_drops() -> None:
    process = LossProcess(GilbertElliott(0.0, 3.0), random.Random(1))
    assert not any(process.lost() for _ in range(1000))


TRACE = """# time_ms loss delay_ms
0     0    40
1200  1    40    # outage
1500  0.5  -
repeat 3000
"""


def test_trace_parses_and_loops() -> None:
    trace = parse_trace(TRACE, "t.trace")
    assert [r.start for r in trace.records] == [0.0, 1.2, 1.5]
    assert trace.at(0.5).loss == 0 and trace.at(1.3).loss == 1 and trace.at(1.6).delay is None
    assert trace.at(3.0 + 1.3).loss == 1  # repeat 3 s
    assert trace.min_delay == pytest.approx(0.04)


@pytest.mark.parametrize("text,fragment", [
    ("", "no records"),
    ("0 0", "t.trace:1"),
    ("0 x 40", "loss must be a number"),
    ("0 0 40\n0 0 40", "t.trace:2: times must strictly increase"),
    ("10 0 40", "first record must be at time 0"),
    ("0 1.5 40", "between 0 and 1"),
    ("0 0 -5", "delay_ms must be a finite number >= 0"),
    ("repeat 100", "repeat period must come after"),
    ("0 0 40\nrepeat 100\n200 0 40", "nothing may follow"),
    ("0 0 40\nrepeat", "expected 'repeat PERIOD_MS'"),
    ("0 0 nan", "finite"),
])
def test_trace_errors_are_typed_and_located(text: str, fragment: str) -> None:
    with pytest.raises(TraceError) as info:
        parse_trace(text, "t.trace")
    assert fragment in str(info.value)
    assert isinstance(info.value, ConfigError) and isinstance(info.value, EloquentError)


def test_trace_file_errors(tmp_path) -> None:
    with pytest.raises(TraceError, match="cannot read trace"):
        load_trace(tmp_path / "missing.trace")
    bad = tmp_path / "bad.trace"
    bad.write_bytes(b"\xff\xfe")
    with pytest.raises(TraceError):
        load_trace(bad)
    good = tmp_path / "good.trace"
    good.write_text(TRACE)
    assert load_trace(good).repeat == pytest.approx(3.0)


def test_schedules_parse_and_reject() -> None:
    assert parse_outage("5:2") == Outage(5.0, 2.0)
    schedule = parse_loss_schedule("0:0.3, 10:0.0")
    assert schedule.at(3, 0.9) == 0.3 and schedule.at(12, 0.9) == 0.0
    for bad in ("5", "a:1", "5:0", "5:-1"):
        with pytest.raises(ConfigError):
            parse_outage(bad)
    for bad in ("0:0.3,0:0.1", "0:1.0", "x", "0:0.1,5"):
        with pytest.raises(ConfigError):
            parse_loss_schedule(bad)
    with pytest.raises(ConfigError):  # 0.7 is unreachable with independent losses
        PathConfig(loss=0.1, burst=1.0, loss_schedule=parse_loss_schedule("0:0.7"))


def _fates(model, times, size=100):
    return [model.transmit(t, size) for t in times]


def test_path_model_is_deterministic_and_applies_delay_jitter_fifo() -> None:
    config = PathConfig(delay=0.05, jitter=0.01, loss=0.1, burst=2.0)
    times = [i * 0.001 for i in range(2000)]
    a, b = _fates(PathModel(config, 7), times), _fates(PathModel(config, 7), times)
    assert a == b
    assert a != _fates(PathModel(config, 8), times)
    arrivals = [x for x in a if x is not None]
    assert all(x >= t + 0.05 for t, x in zip(times, a) if x is not None)
    assert arrivals == sorted(arrivals)  # FIFO by default
    lost = sum(1 for x in a if x is None) / len(a)
    assert 0.05 < lost < 0.15
    reordered = _fates(PathModel(PathConfig(delay=0.05, jitter=0.01, reorder=True), 7), times)
    assert reordered != sorted(reordered)


def test_path_outage_schedule_trace_and_bandwidth() -> None:
    outage = PathModel(PathConfig(delay=0.01, outages=(Outage(1.0, 0.5),)), 1)
    fates = _fates(outage, [0.5, 1.0, 1.2, 1.49, 1.5])
    assert fates[0] is not None and fates[1:4] == [None, None, None] and fates[4] is not None
    assert outage.stats.outage_drops == 3
    scheduled = PathModel(PathConfig(loss_schedule=parse_loss_schedule("0:0.5,1:0.0")), 3)
    early = _fates(scheduled, [i * 1e-4 for i in range(5000)])
    late = _fates(scheduled, [1 + i * 1e-4 for i in range(5000)])
    assert 0.4 < sum(x is None for x in early) / 5000 < 0.6 and all(x is not None for x in late)
    traced = PathModel(PathConfig(delay=0.01, trace=parse_trace("0 0 -\n100 1 -\n200 0 80")), 3)
    assert _fates(traced, [0.05, 0.15, 0.25]) == [pytest.approx(0.06), None, pytest.approx(0.33)]
    slow = PathModel(PathConfig(bandwidth=8000.0), 1)  # 1000 bytes/s
    assert _fates(slow, [0.0, 0.0], size=100) == [pytest.approx(0.1), pytest.approx(0.2)]


def test_slotted_path_gives_the_first_packet_of_a_slot_the_same_fate_for_every_sender() -> None:
    config = PathConfig(delay=0.02, jitter=0.005, loss=0.2, burst=3.0)
    slots = [i * 0.03 for i in range(400)]
    lean = SlottedPath(config, 11, slots, 0.03)
    busy = SlottedPath(config, 11, slots, 0.03)
    lean_fates, busy_fates = [], []
    for j, start in enumerate(slots):
        lean_fates.append(lean.transmit(start, 200))
        busy_fates.append(busy.transmit(start + 0.001, 200))
        for _ in range(j % 3):  # extra packets in the slot do not shift later slots' fates
            busy.transmit(start + 0.002, 200)
    assert [x is None for x in lean_fates] == [x is None for x in busy_fates]
    assert all(b == pytest.approx(a + 0.001) for a, b in zip(lean_fates, busy_fates) if a is not None)
    assert 0.12 < sum(x is None for x in lean_fates) / len(slots) < 0.28
