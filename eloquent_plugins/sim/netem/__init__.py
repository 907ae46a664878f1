"""Network models shared by the simulator (virtual clock) and the UDP relay (real clock)."""

from eloquent_plugins.sim.netem.capacity import (CapacityLink, CapacityTrace, CapacityTraceError, TraceQueue,
                                                 load_mahimahi, parse_mahimahi, trace_paths)
from eloquent_plugins.sim.netem.gilbert import GilbertElliott, LossProcess
from eloquent_plugins.sim.netem.path import Link, PathConfig, PathModel, PathStats
from eloquent_plugins.sim.netem.slotted import SlottedPath
from eloquent_plugins.sim.netem.schedule import LossSchedule, Outage, parse_loss_schedule, parse_outage
from eloquent_plugins.sim.netem.trace import Trace, TraceError, TraceRecord, load_trace, parse_trace

__all__ = ["CapacityLink", "CapacityTrace", "CapacityTraceError", "TraceQueue", "load_mahimahi", "parse_mahimahi",
           "trace_paths", "GilbertElliott", "LossProcess", "Link", "PathConfig", "PathModel", "PathStats", "SlottedPath", "LossSchedule", "Outage",
           "parse_loss_schedule", "parse_outage", "Trace", "TraceError", "TraceRecord", "load_trace",
           "parse_trace"]
