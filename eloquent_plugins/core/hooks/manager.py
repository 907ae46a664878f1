"""Plugin manager and the per-stream hook caller.

``StreamHooks`` checks once whether any plugin implements the per-event hooks, so a server with no such
plugin pays one attribute test per event, not a pluggy call.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pluggy

from eloquent_plugins.core.hooks import specs as hookspecs
from eloquent_plugins.core.codecs.base import Codec
from eloquent_plugins.core.events import StreamEvent
from eloquent_plugins.core.hooks.specs import ENTRY_POINT_GROUP, PROJECT, StreamInfo


def create_plugin_manager(*, load_entry_points: bool = True, plugins: Iterable[object] = ()) -> pluggy.PluginManager:
    """A manager with the hookspecs, the built-in plugin, installed entry points and ``plugins``."""
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    from eloquent_plugins.core.hooks import builtin as builtin_plugin

    if load_entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)  # includes our own "builtin" entry point
    if not pm.is_registered(builtin_plugin):
        pm.register(builtin_plugin, name="builtin")
    for plugin in plugins:
        pm.register(plugin)
    return pm


def _collect(results: Iterable[list[Any] | None]) -> list[Any]:
    return [item for result in results if result for item in result]


def codecs(pm: pluggy.PluginManager) -> dict[str, Codec]:
    return {codec.name: codec for codec in _collect(pm.hook.eloquent_register_codecs())}


class StreamHooks:
    """Calls the per-stream hooks for one stream; nearly free when no plugin implements them."""

    __slots__ = ("_hook", "_lifecycle", "_observe", "_transforms", "stream")

    def __init__(self, pm: pluggy.PluginManager | None, stream: StreamInfo) -> None:
        self.stream = stream
        self._hook = pm.hook if pm is not None else None
        hook = self._hook
        self._observe = bool(hook and hook.eloquent_stream_event.get_hookimpls())
        # pluggy calls the most recently registered implementation first; keep that order.
        self._transforms = [(impl.function, tuple(impl.argnames))
                            for impl in reversed(hook.eloquent_transform_event.get_hookimpls())] if hook else []
        self._lifecycle = bool(hook)

    @property
    def active(self) -> bool:
        """True when some plugin observes or transforms events (callers may skip building events if not)."""
        return self._observe or bool(self._transforms)

    def start(self) -> None:
        if self._lifecycle:
            self._hook.eloquent_stream_start(stream=self.stream)  # type: ignore[union-attr]

    def event(self, event: StreamEvent) -> StreamEvent:
        """Run transforms in pluggy's call order, then observers; return the event to send."""
        for transform, argnames in self._transforms:
            args = {"stream": self.stream, "event": event}
            replacement: Any = transform(*[args[name] for name in argnames])  # bytes-like or None
            if replacement is not None:
                event = StreamEvent(event.index, bytes(replacement), event.kind)
        if self._observe:
            self._hook.eloquent_stream_event(stream=self.stream, event=event)  # type: ignore[union-attr]
        return event

    def error(self, error: BaseException) -> None:
        if self._lifecycle:
            self._hook.eloquent_stream_error(stream=self.stream, error=error)  # type: ignore[union-attr]

    def end(self, reason: str) -> None:
        if self._lifecycle:
            self._hook.eloquent_stream_end(stream=self.stream, reason=reason)  # type: ignore[union-attr]
