"""``eloquent bench sim --links traces --against E2E.json``: the simulator's Eloquent streams beside an end-to-end run
of the same streams (``bench e2e --trace NAME --json``), stream for stream, with how sure their ratio is.

End to end and simulated, stream i starts at the same place in the trace (``links.stream_offset``); the two are
paired by that place, so the e2e run's streams must be among the simulator's (``--seeds``). The row compared is the
one with the e2e run's trace and cross traffic; its conditions must be the e2e run's (tokens, token interval, base
RTT, queue, the engine's steady timing, the QUIC bulk flow), each checked against the conditions the e2e run
recorded (``meta.run``; in a file from before it, its command line as ``bench e2e`` reads it).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from eloquent_plugins.core.errors import ConfigError
from eloquent_plugins.core.stall import stall_metrics
from eloquent_plugins.sim.links import LINK_WINDOW, REQUEST_TTFT
from eloquent_plugins.sim.paired import paired_ratio_interval, ratio_of
from eloquent_plugins.sim.run import StreamRun, stream_place
from eloquent_plugins.sim.scenario import Scenario


@dataclass(frozen=True, slots=True)
class Against:
    """One row, end to end and simulated over the same streams."""

    label: str
    streams: int
    e2e: float
    """The e2e run's mean network-only stall (``stall_net``) over its Eloquent streams."""
    sim: float
    """The simulator's mean stall above the floor over the same streams."""
    low: float
    high: float
    """The paired bootstrap 95% interval of e2e / sim."""

    @property
    def ratio(self) -> float:
        return ratio_of(self.e2e, self.sim)

    def line(self) -> str:
        return (f"against {self.label} end to end ({self.streams} streams): e2e net {self.e2e:.3f}, simulator on the "
                f"same streams {self.sim:.3f}, ratio {self.ratio:.2f}, paired bootstrap 95% interval "
                f"{self.low:.2f}-{self.high:.2f}")

    def as_dict(self) -> dict[str, object]:
        """Plain JSON: an unbounded ratio or interval end (the simulator's streams all at 0) is null."""
        out: dict[str, object] = asdict(self) | {"ratio": self.ratio}
        return {k: None if isinstance(v, float) and math.isinf(v) else v for k, v in out.items()}


@dataclass(frozen=True, slots=True)
class E2ERun:
    """What the comparison needs of an e2e run: its conditions (``meta.run`` of its JSON) and its Eloquent streams."""

    trace: str
    cross: bool
    rtt: float
    tokens: int
    tpot: float
    ttft: float
    queue_packets: int
    plain: bool
    """Eloquent at its defaults, each request on its own path (no --redundancy, --one-path, --shared-queue)."""
    offsets: tuple[float, ...]
    """Per Eloquent stream, its place in the trace (s)."""
    stalls: tuple[float, ...]


def _run_from_argv(argv: list[str]) -> dict[str, Any]:
    """A JSON written before ``meta.run`` existed: its command line, read as ``bench e2e`` reads it."""
    from eloquent_plugins.cli.bench.e2e import _config
    from eloquent_plugins.cli.bench.e2e_links import run_record
    from eloquent_plugins.cli.main import build_parser

    try:
        options = build_parser().parse_args(argv)
    except SystemExit:
        raise ConfigError(f"--against: its command line does not parse: {' '.join(argv)}") from None
    if getattr(options, "trace", None) is None:
        return {"trace": None}
    conditions, workload = _config(options)
    return run_record(options, conditions, workload)


def load_e2e(path: str) -> E2ERun:
    """An e2e ``--json`` file: its Eloquent streams and the conditions it ran them in."""
    not_one = f"--against: {path} is not a bench e2e --trace --json file with Eloquent streams"
    try:
        with open(path, encoding="utf-8") as fp:
            doc = json.load(fp)
        meta, streams, offsets = doc["meta"], doc["per_stream"]["eloquent"], doc["path_offsets"]
        pairs = [(float(offsets[int(s["request"])]), float(s["stall_net"])) for s in streams]
        if not pairs:
            raise ValueError("no Eloquent streams")
    except OSError as exc:
        raise ConfigError(f"--against: cannot read {path}: {exc}") from None
    except (ValueError, KeyError, TypeError, IndexError):
        raise ConfigError(not_one) from None
    run = meta.get("run") if isinstance(meta, dict) else None
    if run is None:
        run = _run_from_argv([str(a) for a in meta.get("argv", [])] if isinstance(meta, dict) else [])
    if not isinstance(run, dict) or run.get("trace") is None:
        raise ConfigError(f"--against: {path} is not from a bench e2e --trace run")
    try:
        return E2ERun(str(run["trace"]), bool(run["cross"]), float(run["rtt"]), int(run["tokens"]),
                      float(run["tpot"]), float(run["ttft"]), int(run["queue_packets"]),
                      not (run["redundancy"] or run["one_path"] or run["shared_queue"]),
                      tuple(o for o, _ in pairs), tuple(x for _, x in pairs))
    except (ValueError, KeyError, TypeError):
        raise ConfigError(not_one) from None


def _check(run: E2ERun, scenario: Scenario) -> None:
    wrong: list[str] = []
    if run.tokens != scenario.tokens:
        wrong.append(f"--tokens {run.tokens}")
    if not math.isclose(run.rtt * 1000, scenario.rtt_ms, abs_tol=1e-6):
        wrong.append(f"--link-rtt {run.rtt * 1000:g}")
    if not math.isclose(run.tpot * 1000, scenario.tpot_ms, abs_tol=1e-6):
        wrong.append(f"a token every {run.tpot * 1000:g} ms (--scenario tpot=...)")
    if not math.isclose(run.ttft, REQUEST_TTFT, abs_tol=1e-9):
        wrong.append(f"the engine's first token after {REQUEST_TTFT:g} s (the e2e run's --ttft {run.ttft:g}"
                     " moves its streams in the trace)")
    if run.queue_packets != scenario.queue_packets:
        wrong.append(f"--queue-packets {run.queue_packets}")
    if scenario.decode != "steady":
        wrong.append("--decode steady (the engine's timing)")
    if run.cross and scenario.cross_flow != "quic":
        wrong.append("--cross-flow quic (the e2e bulk flow)")
    if scenario.window != LINK_WINDOW or scenario.codel or scenario.recarry:
        wrong.append(f"the front end's sender and queues (--eloquent-window {LINK_WINDOW}, no --codel or "
                     "--recarry-limit)")
    if not run.plain:
        raise ConfigError("--against: the e2e run must be Eloquent at its defaults, each request on its own path "
                          "(no --redundancy, --one-path or --shared-queue)")
    if wrong:
        raise ConfigError(f"--against: the simulator's row must run as the e2e run did: {', '.join(wrong)}")


def _place(scenario: Scenario, seed: int, stream: int) -> float:
    """Where the simulator's stream starts in the trace, to the microsecond."""
    return round(stream_place(scenario, seed, stream), 6)


def _cover(run: E2ERun, places: set[float]) -> None:
    missing = [o for o in run.offsets if round(o, 6) not in places]
    if missing:
        raise ConfigError(f"--against: {len(missing)} of the e2e run's {len(run.offsets)} streams are not among "
                          f"the simulator's (the first at {missing[0]:g} s in the trace): run more --seeds")


@dataclass(frozen=True, slots=True)
class E2ERow:
    """An e2e run and the simulator's row it is compared with, checked before the simulator runs."""

    run: E2ERun
    index: int
    scenario: Scenario
    path: str

    @classmethod
    def load(cls, path: str, scenarios: Sequence[Scenario], seeds: Sequence[int]) -> E2ERow:
        run = load_e2e(path)
        index = next((i for i, s in enumerate(scenarios) if s.link == run.trace and bool(s.cross) == run.cross),
                     None)
        if index is None:
            raise ConfigError(f"--against: this run has no row for {run.trace} {'with' if run.cross else 'without'} "
                              f"cross traffic (--trace {run.trace} --cross {int(run.cross)})")
        scenario = scenarios[index]
        _check(run, scenario)
        planned = {_place(scenario, seed, k) for seed in seeds for k in range(scenario.streams)}
        _cover(run, planned)
        return cls(run, index, scenario, path)

    def against(self, streams: Sequence[tuple[int, int, dict[str, StreamRun]]]) -> Against:
        """``streams``: the row's (seed, stream, per-scheme runs); the e2e run's streams, paired by their place."""
        scenario, run = self.scenario, self.run
        simulated: dict[float, float] = {}
        for seed, stream, per in streams:
            r = per["eloquent"]
            simulated[_place(scenario, seed, stream)] = stall_metrics(r.ready, r.rendered, r.min_delay).stall_ratio
        _cover(run, set(simulated))
        sim = [simulated[round(o, 6)] for o in run.offsets]
        low, high = paired_ratio_interval(run.stalls, sim)
        return Against(scenario.label, len(sim), sum(run.stalls) / len(sim), sum(sim) / len(sim), low, high)
