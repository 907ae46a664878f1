"""Deterministic discrete-event simulator: one server streaming tokens to one client under each scheme
(TCP retransmission, duplication, the real Eloquent sender/receiver, an oracle) over the netem path models."""

from eloquent_plugins.sim.clock import EventLoop, SimulationError
from eloquent_plugins.sim.matrix import Plan, custom_plan, quick_plan, standard_plan
from eloquent_plugins.sim.report import ScenarioResult, SchemeMetrics, summarize_scenario, summary
from eloquent_plugins.sim.run import SCHEMES, StreamRun, simulate_stream
from eloquent_plugins.sim.scenario import Scenario, parse_scenario

__all__ = ["EventLoop", "SimulationError", "Plan", "custom_plan", "quick_plan", "standard_plan", "ScenarioResult",
           "SchemeMetrics", "summarize_scenario", "summary", "SCHEMES", "StreamRun", "simulate_stream", "Scenario",
           "parse_scenario"]
