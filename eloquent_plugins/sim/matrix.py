"""The scenario sets ``eloquent bench sim`` runs: the standard matrix and a reduced one for quick checks."""

from __future__ import annotations

from dataclasses import dataclass, replace

from eloquent_plugins.sim.scenario import Scenario

STANDARD_LOSSES = (0.01, 0.05, 0.10, 0.20)
STANDARD_BURSTS = (1.0, 4.0)
STANDARD_RTTS = (20.0, 100.0, 300.0)


@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    scenarios: tuple[Scenario, ...]
    seeds: tuple[int, ...]


def standard_plan(seed: int = 1) -> Plan:
    """4 loss rates x 2 burst lengths x 3 RTTs, 4 streams of 300 tokens each, 3 seeds: 288 streams per scheme."""
    scenarios = tuple(Scenario(loss=loss, burst=burst, rtt_ms=rtt, tokens=300, streams=4)
                      for loss in STANDARD_LOSSES for burst in STANDARD_BURSTS for rtt in STANDARD_RTTS)
    return Plan("standard", scenarios, (seed, seed + 1, seed + 2))


def quick_plan(seed: int = 1) -> Plan:
    """Loss 5% and 20%, bursts 1 and 4, RTT 20 and 300 ms, 2 streams of 200 tokens, one seed."""
    scenarios = tuple(Scenario(loss=loss, burst=burst, rtt_ms=rtt, tokens=200, streams=2)
                      for loss in (0.05, 0.20) for burst in STANDARD_BURSTS for rtt in (20.0, 300.0))
    return Plan("quick", scenarios, (seed,))


def custom_plan(scenarios: list[Scenario], seed: int = 1, seeds: int = 3) -> Plan:
    return Plan("custom", tuple(scenarios), tuple(range(seed, seed + seeds)))


def with_tokens(plan: Plan, tokens: int | None, streams: int | None) -> Plan:
    if tokens is None and streams is None:
        return plan
    return replace(plan, scenarios=tuple(
        replace(s, tokens=tokens or s.tokens, streams=streams or s.streams) for s in plan.scenarios))
