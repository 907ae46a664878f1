"""The core hooks a plugin can implement, in one place (as pytest does); transports add their own (below).

Plugins register through the ``eloquent_plugins`` entry-point group; each entry point names a module or object
holding ``@hookimpl`` functions. Observers return nothing; ``eloquent_transform_event`` may replace an
event's payload; the ``eloquent_register_*`` hooks each return a list of things to add.

A transport with hooks of its own adds their specs to the manager itself (``pm.add_hookspecs``), as pytest
plugins do, so the core never imports a transport: ``eloquent_register_resume_stores`` lives in
``transports/resume/hooks.py``, ``eloquent_register_upstreams`` in ``transports/upstream.py``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from eloquent_plugins.core.codecs.base import Codec
    from eloquent_plugins.core.events import StreamEvent

PROJECT = "eloquent_plugins"
ENTRY_POINT_GROUP = "eloquent_plugins"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@dataclass(slots=True)
class StreamInfo:
    """What hooks learn about a stream; ``attributes`` is free for plugins to share per-stream state."""

    stream_id: str
    route: str = ""
    transport: str = "sse"
    codec: str = "raw"
    attributes: dict[str, Any] = field(default_factory=dict)


@hookspec
def eloquent_stream_start(stream: StreamInfo) -> None:
    """A stream began (before its first event)."""


@hookspec
def eloquent_stream_event(stream: StreamInfo, event: StreamEvent) -> None:
    """Observe one event as it enters the stream log (after transforms)."""


@hookspec
def eloquent_transform_event(stream: StreamInfo, event: StreamEvent) -> bytes | None:
    """Return a replacement payload for the event, or None to leave it. Chained in pluggy's call order."""


@hookspec
def eloquent_stream_end(stream: StreamInfo, reason: str) -> None:
    """A stream ended: ``reason`` is ``complete``, ``error``, ``aborted`` or ``disconnected``."""


@hookspec
def eloquent_stream_error(stream: StreamInfo, error: BaseException) -> None:
    """The engine failed after the stream started (the client gets an in-band error event)."""


@hookspec
def eloquent_register_codecs() -> list[Codec]:  # type: ignore[empty-body]
    """Codecs for engine event formats (OpenAI, TGI, Triton, ...)."""
