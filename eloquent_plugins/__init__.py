"""eloquent-plugins: robust, fast LLM token streaming (keep-alive, resumable SSE, Eloquent over QUIC).

The core is sans-I/O: ``EloquentSender``/``EloquentReceiver`` take events, datagrams and the time and return
datagrams, events and deadlines. Transports, the simulator and the tests all drive these same machines.

``StreamConfig`` (the deployment settings, ``transports/config.py``) is re-exported here but loaded on first use,
so that importing the core (as the client does) never loads the transports.
"""

from typing import TYPE_CHECKING, Any

from eloquent_plugins.core.errors import (ConfigError, DecodeError, EloquentError, LimitExceeded, ProtocolError, ProtocolViolation,
                     StreamClosed)
from eloquent_plugins.core.events import EventKind, StreamEvent
from eloquent_plugins.core.keepalive import KeepAlivePolicy, KeepAliveTimer
from eloquent_plugins.core.limits import Limits
from eloquent_plugins.core.receiver import EloquentReceiver, ReceiverConfig
from eloquent_plugins.core.sender import EloquentSender, SenderConfig
from eloquent_plugins.core.stall import StallReport, stall_metrics

__version__ = "0.1.0"

if TYPE_CHECKING:
    from eloquent_plugins.transports.config import StreamConfig


def __getattr__(name: str) -> Any:
    if name == "StreamConfig":
        from eloquent_plugins.transports.config import StreamConfig

        return StreamConfig
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ConfigError", "DecodeError", "EloquentError", "EloquentReceiver", "EloquentSender", "EventKind",
    "KeepAlivePolicy", "KeepAliveTimer", "LimitExceeded", "Limits", "ProtocolError", "ProtocolViolation",
    "ReceiverConfig", "SenderConfig", "StallReport", "StreamClosed", "StreamConfig", "StreamEvent",
    "stall_metrics", "__version__",
]
