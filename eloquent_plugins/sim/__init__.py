"""Deterministic discrete-event simulator: one server streaming tokens to one client under each scheme
(TCP retransmission, duplication, the real Eloquent sender/receiver, an oracle) over the netem path models."""

from .clock import EventLoop, SimulationError
from .matrix import Plan, custom_plan, quick_plan, standard_plan
from .report import ScenarioResult, SchemeMetrics, summarize_scenario, summary
from .run import SCHEMES, StreamRun, simulate_stream
from .scenario import Scenario, parse_scenario

__all__ = ["EventLoop", "SimulationError", "Plan", "custom_plan", "quick_plan", "standard_plan", "ScenarioResult",
           "SchemeMetrics", "summarize_scenario", "summary", "SCHEMES", "StreamRun", "simulate_stream", "Scenario",
           "parse_scenario"]
