"""Network models shared by the simulator (virtual clock) and the UDP relay (real clock)."""

from .gilbert import GilbertElliott, LossProcess
from .path import Link, PathConfig, PathModel, PathStats
from .slotted import SlottedPath
from .schedule import LossSchedule, Outage, parse_loss_schedule, parse_outage
from .trace import Trace, TraceError, TraceRecord, load_trace, parse_trace

__all__ = ["GilbertElliott", "LossProcess", "Link", "PathConfig", "PathModel", "PathStats", "SlottedPath", "LossSchedule", "Outage",
           "parse_loss_schedule", "parse_outage", "Trace", "TraceError", "TraceRecord", "load_trace",
           "parse_trace"]
